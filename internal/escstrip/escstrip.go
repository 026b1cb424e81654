// Package escstrip removes terminal escape sequences from text: what a
// command wrote for a terminal (colours, cursor moves, titles, hyperlinks)
// is kept as the plain text it shows. Run output is stored and read as
// text (in JSON, in log files, in a browser), where those sequences are
// noise at best and, replayed on a reader's terminal, an injection at worst.
//
// It follows the ECMA-48 (ANSI X3.64) grammar as terminals parse it, for
// 7-bit sequences:
//
//   - CSI: ESC [ parameters intermediates final (colours, cursor, erase);
//   - OSC: ESC ] ... ended by BEL or ST (ESC \) (titles, hyperlinks);
//   - DCS, SOS, PM and APC: ESC P, ESC X, ESC ^, ESC _ ... ended by ST;
//   - every other escape: ESC, intermediates (0x20-0x2f), a final byte.
//
// The 8-bit forms of C1 controls (0x80-0x9f) are left alone: in UTF-8 text
// those bytes are parts of characters. Other control characters (newline,
// carriage return, tab, backspace, bell) are text and are kept.
//
// Invariants: a Stripper keeps its state between calls, so a sequence split
// across writes is removed whole; it holds no more than its state (no
// buffer), so any input is processed in time and memory linear in its
// length. A sequence that never ends cannot swallow the rest of the
// stream: a string sequence (OSC, DCS, ...) ends at a newline or after
// MaxString bytes, a CSI after MaxCSI bytes; what followed is text again.
package escstrip

import "io"

// MaxString bounds an OSC, DCS, SOS, PM or APC string: past it the
// sequence is taken for a stray escape and dropped, and what follows is
// text again. Real ones are short (a window title, a hyperlink's URL).
const MaxString = 4096

// MaxCSI bounds a control sequence's parameters and intermediates; real
// ones are a few bytes.
const MaxCSI = 64

// Control characters with a meaning of their own in the grammar.
const (
	bel = 0x07
	can = 0x18 // cancels a sequence
	sub = 0x1a // cancels a sequence
	esc = 0x1b
)

type state uint8

const (
	ground    state = iota
	escape          // after ESC
	escInter        // ESC and intermediates, waiting for the final byte
	csi             // ESC [ ..., waiting for the final byte
	str             // in an OSC, DCS, SOS, PM or APC string
	strEscape       // ESC inside a string: ST if '\' follows
)

// Stripper removes escape sequences from a stream given to it in pieces.
// The zero value is ready to use. It is not safe for concurrent use.
type Stripper struct {
	st state
	// osc: the string is an OSC, which BEL also ends.
	osc bool
	// n counts the bytes of the current CSI or string (see MaxCSI,
	// MaxString).
	n int
}

// Append appends to dst what of src is text, and returns the extended
// slice. src may end in the middle of a sequence: the next call goes on
// from there.
func (s *Stripper) Append(dst, src []byte) []byte {
	start := -1 // where the current run of text in src began
	for i, b := range src {
		if s.st == ground && b != esc {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 {
			dst = append(dst, src[start:i]...)
			start = -1
		}
		if keep, ok := s.step(b); ok {
			dst = append(dst, keep)
		}
	}
	if start >= 0 {
		dst = append(dst, src[start:]...)
	}
	return dst
}

// step consumes b outside of text (or ESC in text) and reports the byte to
// keep, if any: a control character that a terminal would carry out in the
// middle of a sequence, or a byte that shows the sequence was not one.
func (s *Stripper) step(b byte) (byte, bool) {
	switch s.st {
	case ground: // b is ESC
		s.st = escape
	case escape:
		return s.afterEscape(b)
	case escInter:
		switch {
		case b >= 0x20 && b <= 0x2f:
		case b >= 0x30 && b <= 0x7e:
			s.st = ground
		default:
			return s.interrupt(b)
		}
	case csi:
		s.n++
		switch {
		case b >= 0x40 && b <= 0x7e:
			s.st = ground
		case b >= 0x20 && b <= 0x3f:
			if s.n > MaxCSI {
				s.st = ground
			}
		default:
			return s.interrupt(b)
		}
	case str:
		s.n++
		switch {
		case b == esc:
			s.st = strEscape
		case b == bel && s.osc, b == can, b == sub:
			s.st = ground
		case b == '\n':
			// No sequence spans lines: this one was a stray escape.
			s.st = ground
			return b, true
		case s.n > MaxString:
			s.st = ground
		}
	case strEscape:
		if b == '\\' {
			s.st = ground
			return 0, false
		}
		// An escape that is not ST ends the string and starts anew.
		s.st = escape
		return s.afterEscape(b)
	}
	return 0, false
}

// afterEscape consumes the byte that follows ESC.
func (s *Stripper) afterEscape(b byte) (byte, bool) {
	s.n = 0
	switch {
	case b == '[':
		s.st = csi
	case b == ']':
		s.st, s.osc = str, true
	case b == 'P', b == 'X', b == '^', b == '_':
		s.st, s.osc = str, false
	case b == esc:
		// ESC ESC: the first was lone; the second starts a sequence.
	case b >= 0x20 && b <= 0x2f:
		s.st = escInter
	case b >= 0x30 && b <= 0x7e:
		s.st = ground
	case b == 0x7f:
		// DEL is ignored inside sequences.
	default:
		return s.interrupt(b)
	}
	return 0, false
}

// interrupt handles a byte that cannot continue the current escape or
// control sequence: CAN and SUB cancel it, ESC starts another, a newline
// ends it (no sequence spans lines: a lone ESC must not eat the start of
// the next one), another control character is carried out (kept) with the
// sequence going on, as terminals do; anything else (a UTF-8 byte) shows
// there was no sequence, and is text.
func (s *Stripper) interrupt(b byte) (byte, bool) {
	switch {
	case b == '\n':
		s.st = ground
		return b, true
	case b == can, b == sub:
		s.st = ground
		return 0, false
	case b == esc:
		s.st = escape
		return 0, false
	case b < 0x20:
		return b, true
	case b == 0x7f:
		return 0, false
	}
	s.st = ground
	return b, true
}

// String returns s without its escape sequences.
func String(s string) string {
	var st Stripper
	return string(st.Append(make([]byte, 0, len(s)), []byte(s)))
}

// Writer writes what is written to it, without escape sequences, to the
// writer it wraps. It is not safe for concurrent use.
type Writer struct {
	w   io.Writer
	s   Stripper
	buf []byte
}

// NewWriter returns a Writer that strips what it writes to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write strips p and writes the rest to the wrapped writer in one call. It
// reports all of p written when that write succeeds (escape sequences are
// consumed, not lost), and 0 with the error when it does not.
func (w *Writer) Write(p []byte) (int, error) {
	w.buf = w.s.Append(w.buf[:0], p)
	if len(w.buf) > 0 {
		if _, err := w.w.Write(w.buf); err != nil {
			return 0, err
		}
	}
	if cap(w.buf) > 64<<10 {
		w.buf = nil // a huge write does not pin its buffer
	}
	return len(p), nil
}
