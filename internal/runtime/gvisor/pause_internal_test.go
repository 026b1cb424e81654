package gvisor

import (
	"reflect"
	"testing"
)

func TestOpenTCP(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0100007F:0050 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 100 0 0 10 0
   3: 0100007F:D2F0 0100007F:0050 06 00000000:00000000 00:00000000 00000000     0        0 4 1 0000000000000000 100 0 0 10 0
`
	want := []string{"00000000:1F90 0A", "0100007F:0050 01"}
	if got := openTCP(table); !reflect.DeepEqual(got, want) {
		t.Fatalf("openTCP = %q, want %q", got, want)
	}
	if got := openTCP(""); got != nil {
		t.Fatalf("openTCP of nothing = %q", got)
	}
}
