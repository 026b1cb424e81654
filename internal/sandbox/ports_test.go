package sandbox

import (
	"reflect"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

func TestListeningPorts(t *testing.T) {
	const procNetTCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0BB8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0100007F:0050 0100007F:A2B4 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
`
	got, err := listeningPorts(strings.NewReader(procNetTCP))
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{3000, 80}; !reflect.DeepEqual(got, want) {
		t.Fatalf("ports %v, want %v", got, want)
	}
	if _, err := listeningPorts(strings.NewReader("h\n 0: 00000000:ZZZZ 00000000:0000 0A\n")); err == nil {
		t.Fatal("bad port accepted")
	}
}

// TestListeningPortsHostile: the table comes through the agent, which guest
// root can replace; what it claims must not reach the API unchecked.
func TestListeningPortsHostile(t *testing.T) {
	securitytest.Attack(t, "guest", "a replaced agent answers the port listing with port 0, a million duplicate listeners and an endless line",
		"port 0 and overlong lines are refused, duplicates listed once, the table read at most 8 MiB")
	const head = "  sl  local_address rem_address   st\n"
	if _, err := listeningPorts(strings.NewReader(head + " 0: 00000000:0000 00000000:0000 0A\n")); err == nil {
		t.Error("port 0 accepted")
	}
	dup := head + strings.Repeat(" 1: 00000000:1F90 00000000:0000 0A\n", 1_000_000)
	got, err := listeningPorts(strings.NewReader(dup))
	if err != nil || !reflect.DeepEqual(got, []int{8080}) {
		t.Errorf("duplicates: %v, %v; want [8080]", got, err)
	}
	if _, err := listeningPorts(strings.NewReader(head + " 1: " + strings.Repeat("0", 1<<20) + ":0050 0 0A\n")); err == nil {
		t.Error("a 1 MiB line was parsed")
	}
}
