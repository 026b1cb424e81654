package capbuf

import "testing"

func TestBuffer(t *testing.T) {
	cases := []struct {
		max     int
		writes  []string
		kept    string
		dropped int64
	}{
		{4, []string{"ab", "cdef", "gh"}, "abcd", 4},
		{10, []string{"ab", "cd"}, "abcd", 0},
		{0, []string{"x"}, "", 1},
		{3, []string{"abc", ""}, "abc", 0},
	}
	for _, tc := range cases {
		b := New(tc.max)
		for _, w := range tc.writes {
			if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
				t.Fatalf("Write(%q) = %d, %v", w, n, err)
			}
		}
		if got := b.String("elsewhere"); tc.dropped == 0 && got != tc.kept {
			t.Errorf("%v: kept %q, want %q", tc.writes, got, tc.kept)
		}
		if b.Dropped() != tc.dropped {
			t.Errorf("%v: dropped %d, want %d", tc.writes, b.Dropped(), tc.dropped)
		}
		if tc.dropped > 0 {
			want := tc.kept + "\n[sandboxd: " + itoa(tc.dropped) + " more bytes elsewhere]\n"
			if got := b.String("elsewhere"); got != want {
				t.Errorf("%v: %q, want %q", tc.writes, got, want)
			}
		}
	}
}

func itoa(n int64) string {
	if n == 0 {
		return "0"
	}
	var d []byte
	for ; n > 0; n /= 10 {
		d = append([]byte{byte('0' + n%10)}, d...)
	}
	return string(d)
}
