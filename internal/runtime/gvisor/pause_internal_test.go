package gvisor

import (
	"reflect"
	"testing"
)

// TestTCPTable: /proc/net/tcp and tcp6 lines read as the sockets a user
// knows (addresses in the kernel's byte order, states by name), and those
// that keep Debian's 2022 runsc from saving are all but the closed ones
// and the agent's own (its listener for sandboxd.internal and the
// connections it accepted there); a process's connection to
// sandboxd.internal counts.
func TestTCPTable(t *testing.T) {
	for _, tc := range []struct {
		name, table string
		want        []string
	}{{
		name: "tcp",
		table: `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0100007F:0050 0100007F:5F6D 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 100 0 0 10 0
   3: 0100007F:5F6D 0100007F:0050 01 00000000:00000000 00:00000000 00000000     0        0 4 1 0000000000000000 100 0 0 10 0
   4: 0100007F:D2F0 0100007F:0050 06 00000000:00000000 00:00000000 00000000     0        0 5 1 0000000000000000 100 0 0 10 0
   5: 0100007F:0050 0100007F:D2F2 08 00000000:00000000 00:00000000 00000000     0        0 6 1 0000000000000000 100 0 0 10 0
   6: 0F02000A:C350 2200A8C0:01BB 08 00000000:00000000 00:00000000 00000000     0        0 7 1 0000000000000000 100 0 0 10 0
`,
		want: []string{
			"0.0.0.0:8080 LISTEN",
			"127.0.0.1:24429 → 127.0.0.1:80 ESTABLISHED (to sandboxd.internal)",
			"10.0.2.15:50000 → 192.168.0.34:443 CLOSE_WAIT",
		},
	}, {
		name: "tcp6",
		table: `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:A0B0 00000000000000000000000001000000:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:A0B1 0000000000000000FFFF00000100007F:0050 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 100 0 0 10 0
`,
		want: []string{
			"[::]:8080 LISTEN",
			"[::1]:41136 → [::1]:8080 ESTABLISHED",
			"127.0.0.1:41137 → 127.0.0.1:80 ESTABLISHED (to sandboxd.internal)",
		},
	}, {
		name: "nothing", table: "",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, s := range parseTCPTable(tc.table) {
				if s.blocksSave() {
					got = append(got, s.String())
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("sockets that block a save:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}
