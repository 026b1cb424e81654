package api

import (
	"strings"
	"testing"
)

// TestNewLogText: what a followed build log adds is found after the tail
// of what was sent, also when the store cut the log's front meanwhile;
// text that left the log entirely is said to be dropped.
func TestNewLogText(t *testing.T) {
	line := func(i int) string { return strings.Repeat("x", 100) + " line " + string(rune('a'+i%26)) + "\n" }
	var sent string
	for i := range 60 { // longer than the anchor
		sent += line(i)
	}
	for _, c := range []struct {
		name, log, more string
		dropped         bool
	}{
		{"nothing new", sent, "", false},
		{"appended", sent + "new\n", "new\n", false},
		{"front cut", sent[1000:] + "new\n", "new\n", false},
		{"all replaced", "other\n", "other\n", true},
	} {
		more, dropped := newLogText(sent, c.log)
		if more != c.more || dropped != c.dropped {
			t.Errorf("%s: %q %v, want %q %v", c.name, more, dropped, c.more, c.dropped)
		}
	}
	if more, dropped := newLogText("", "first\n"); more != "first\n" || dropped {
		t.Errorf("first read: %q %v", more, dropped)
	}
}
