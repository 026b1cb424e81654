package escstrip

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

var cases = []struct {
	name, in, want string
}{
	{"plain text", "hello\nworld\n", "hello\nworld\n"},
	{"utf-8 is text", "héllo ✓ 日本\n", "héllo ✓ 日本\n"},
	{"C1 bytes of UTF-8 are text", "\u009b\u00c2\u009b", "\u009b\u00c2\u009b"},
	{"controls are text", "a\rb\tc\bd\ae\n", "a\rb\tc\bd\ae\n"},
	{"SGR colour", "\x1b[31mred\x1b[0m plain", "red plain"},
	{"SGR with many parameters", "\x1b[1;38;5;208;48;2;10;20;30mX\x1b[m", "X"},
	{"private CSI (cursor hide/show)", "\x1b[?25lspin\x1b[?25h", "spin"},
	{"CSI with intermediate", "\x1b[2 qcursor", "cursor"},
	{"erase line and carriage return kept", "50%\r\x1b[2K100%\n", "50%\r100%\n"},
	{"OSC title ended by BEL", "\x1b]0;my title\x07after", "after"},
	{"OSC ended by ST", "\x1b]0;title\x1b\\after", "after"},
	{"OSC 8 hyperlink", "\x1b]8;;https://example.test/a?b=c\x1b\\link\x1b]8;;\x1b\\ done", "link done"},
	{"DCS", "\x1bPq#0;2;0;0;0#1~~@@\x1b\\after", "after"},
	{"APC PM SOS", "\x1b_apc\x1b\\a\x1b^pm\x1b\\b\x1bXsos\x1b\\c", "abc"},
	{"BEL does not end a DCS", "\x1bPdata\x07more\x1b\\x", "x"},
	{"charset designation", "\x1b(Bascii\x1b)0", "ascii"},
	{"keypad and save/restore", "\x1b=\x1b>\x1b7text\x1b8", "text"},
	{"reset", "\x1bcfresh", "fresh"},
	{"ESC ESC", "\x1b\x1b[31mred", "red"},
	{"CAN cancels a CSI", "\x1b[31\x18text", "text"},
	{"SUB cancels a string", "\x1b]0;ti\x1atext", "text"},
	{"control inside CSI is carried out", "\x1b[3\r1mtext", "\rtext"},
	{"newline ends a stray OSC", "\x1b]no end\nnext line\n", "\nnext line\n"},
	{"newline ends a lone ESC", "key\x1b\nnext\n", "key\nnext\n"},
	{"newline ends a CSI", "\x1b[12\nnext", "\nnext"},
	{"UTF-8 after ESC is text", "\x1bé", "é"},
	{"UTF-8 in CSI ends it", "\x1b[1é", "é"},
	{"UTF-8 in OSC is dropped with it", "\x1b]0;日本\x07x", "x"},
	{"ESC in a string starts a new sequence", "\x1b]0;t\x1b[31mred", "red"},
	{"DEL inside sequences is ignored", "\x1b\x7f[31mred", "red"},
	{"trailing ESC", "text\x1b", "text"},
	{"trailing CSI", "text\x1b[3", "text"},
}

func TestString(t *testing.T) {
	for _, c := range cases {
		if got := String(c.in); got != c.want {
			t.Errorf("%s: String(%q) = %q, want %q", c.name, c.in, got, c.want)
		}
	}
}

// TestSplit: a sequence split across writes is removed whole, wherever
// the split falls.
func TestSplit(t *testing.T) {
	for _, c := range cases {
		for i := 0; i <= len(c.in); i++ {
			for j := i; j <= len(c.in); j++ {
				var s Stripper
				got := s.Append(nil, []byte(c.in[:i]))
				got = s.Append(got, []byte(c.in[i:j]))
				got = s.Append(got, []byte(c.in[j:]))
				if string(got) != c.want {
					t.Fatalf("%s split at %d and %d: %q, want %q", c.name, i, j, got, c.want)
				}
			}
		}
	}
}

// TestBounded: a sequence that never ends cannot swallow the stream.
func TestBounded(t *testing.T) {
	t.Run("string", func(t *testing.T) {
		in := "\x1b]" + strings.Repeat("x", MaxString+1) + "text"
		if got := String(in); got != "text" {
			t.Fatalf("an unterminated OSC longer than %d bytes left %q, want the text after it", MaxString, got)
		}
	})
	t.Run("csi", func(t *testing.T) {
		in := "\x1b[" + strings.Repeat("1", MaxCSI+1) + "text"
		if got := String(in); got != "text" {
			t.Fatalf("an unterminated CSI left %q", got)
		}
	})
	t.Run("one byte at a time", func(t *testing.T) {
		var s Stripper
		var out []byte
		in := "\x1b]" + strings.Repeat("y", 3*MaxString) + "\x1b[1mok"
		for i := range len(in) {
			out = s.Append(out, []byte{in[i]})
		}
		if want := strings.Repeat("y", 2*MaxString-1) + "ok"; string(out) != want {
			t.Fatalf("got %d bytes, want %d", len(out), len(want))
		}
	})
}

func TestWriter(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, p := range []string{"\x1b[3", "2mgreen", "\x1b[0m\n", "\x1b]0;t"} {
		if n, err := w.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", p, n, err)
		}
	}
	if buf.String() != "green\n" {
		t.Fatalf("wrote %q", buf.String())
	}
	boom := errors.New("boom")
	if n, err := NewWriter(failing{boom}).Write([]byte("x")); n != 0 || !errors.Is(err, boom) {
		t.Fatalf("a failed write: %d, %v", n, err)
	}
	// Nothing to write is no write at all.
	if n, err := NewWriter(failing{boom}).Write([]byte("\x1b[0m")); n != 4 || err != nil {
		t.Fatalf("a write of a sequence alone: %d, %v", n, err)
	}
}

type failing struct{ err error }

func (f failing) Write([]byte) (int, error) { return 0, f.err }

// FuzzStripper checks what holds for any input: no ESC comes out, the
// output is what the input had in the same order (nothing is added), text
// without ESC is unchanged, and the result does not depend on how the input
// was cut into writes.
func FuzzStripper(f *testing.F) {
	for _, c := range cases {
		f.Add([]byte(c.in), uint(len(c.in)/2))
	}
	f.Fuzz(func(t *testing.T, in []byte, cut uint) {
		whole := (&Stripper{}).Append(nil, in)
		if bytes.IndexByte(whole, esc) >= 0 {
			t.Fatalf("ESC in the output of %q: %q", in, whole)
		}
		if !subsequence(whole, in) {
			t.Fatalf("output %q is not a subsequence of %q", whole, in)
		}
		if bytes.IndexByte(in, esc) < 0 && !bytes.Equal(whole, in) {
			t.Fatalf("text without ESC changed: %q -> %q", in, whole)
		}
		i := int(cut % uint(len(in)+1))
		var s Stripper
		split := s.Append(s.Append(nil, in[:i]), in[i:])
		if !bytes.Equal(split, whole) {
			t.Fatalf("cut at %d: %q, whole: %q", i, split, whole)
		}
	})
}

func subsequence(sub, of []byte) bool {
	for _, b := range sub {
		i := bytes.IndexByte(of, b)
		if i < 0 {
			return false
		}
		of = of[i+1:]
	}
	return true
}
