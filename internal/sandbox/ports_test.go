package sandbox

import (
	"reflect"
	"strings"
	"testing"
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
