package agent

import (
	"bytes"
	"fmt"
	"testing"
)

func TestTail(t *testing.T) {
	var all []byte
	tl := tail{max: 10}
	for i := range 30 {
		chunk := []byte(fmt.Sprintf("%d,", i))
		if i%7 == 6 {
			chunk = bytes.Repeat([]byte{'x'}, 13) // longer than the tail
		}
		tl.write(chunk)
		all = append(all, chunk...)
		if tl.total != uint64(len(all)) {
			t.Fatalf("total %d, want %d", tl.total, len(all))
		}
		for _, from := range []uint64{0, uint64(len(all)) - 3, uint64(len(all)), uint64(len(all)) + 5} {
			got, off := tl.from(from)
			wantOff := max(min(from, uint64(len(all))), uint64(max(len(all)-10, 0)))
			if off != wantOff {
				t.Fatalf("after %q from %d: offset %d, want %d", all, from, off, wantOff)
			}
			if want := all[off:]; !bytes.Equal(got, want) {
				t.Fatalf("after %q from %d: %q, want %q", all, from, got, want)
			}
		}
	}
}
