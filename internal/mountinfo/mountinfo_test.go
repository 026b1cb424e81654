package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:               "/plain",
		`/with\040space`:       "/with space",
		`/tab\011and\134slash`: "/tab\tand\\slash",
		`/not\09octal`:         `/not\09octal`,
		`/end\04`:              `/end\04`,
		`/too\777big`:          `/too\777big`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnder(t *testing.T) {
	// /proc is a mount point on every Linux host; / is everything's parent.
	if !IsMountPoint("/proc") {
		t.Fatal("/proc is not a mount point")
	}
	if IsMountPoint(t.TempDir()) {
		t.Fatal("a fresh temp dir is a mount point")
	}
	got, err := Under("/proc")
	if err != nil || len(got) == 0 || got[0] != "/proc" {
		t.Fatalf("Under(/proc) = %v, %v", got, err)
	}
	if got, err := Under(t.TempDir()); err != nil || len(got) != 0 {
		t.Fatalf("Under(temp dir) = %v, %v", got, err)
	}
}
