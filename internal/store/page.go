package store

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Cursor is a place in a list ordered by a time and then an id: the row
// a page ended with, after which the next page begins. The lists the API
// pages are newest first by creation time; the retention sweep goes
// through ended rows oldest first by when they ended. Paging by the row's
// keys rather than by an offset keeps a page from repeating or skipping
// rows when newer ones arrive or older ones are deleted between two
// requests. The zero Cursor is the list's start.
type Cursor struct {
	CreatedAt time.Time // or, for the sweep, when the row ended
	ID        string
}

// IsZero reports whether c is the start of a list.
func (c Cursor) IsZero() bool { return c.ID == "" }

// cursorVersion starts every encoded cursor, so that a later format can
// tell its own from these.
const cursorVersion = "c1:"

// String encodes c for a client, who hands it back as it is: "" for the
// start of a list.
func (c Cursor) String() string {
	if c.IsZero() {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(cursorVersion + strconv.FormatInt(c.CreatedAt.UnixMilli(), 10) + ":" + c.ID))
}

// ParseCursor decodes what Cursor.String made; anything else is
// ErrInvalid. "" is the start of a list.
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return Cursor{}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	rest, ok := strings.CutPrefix(string(b), cursorVersion)
	if err != nil || !ok {
		return Cursor{}, fmt.Errorf("%w: not a cursor", ErrInvalid)
	}
	at, id, ok := strings.Cut(rest, ":")
	millis, err := strconv.ParseInt(at, 10, 64)
	if !ok || err != nil || id == "" {
		return Cursor{}, fmt.Errorf("%w: not a cursor", ErrInvalid)
	}
	return Cursor{CreatedAt: fromMillis(millis), ID: id}, nil
}

// older returns the condition (with its arguments) that selects the rows
// past c in a list ordered by at DESC, id DESC, those being the columns'
// names; true at the start of a list.
func (c Cursor) older(at, id string) (string, []any) {
	return c.past(at, id, "<")
}

// newer is older for a list ordered by at, id (ascending).
func (c Cursor) newer(at, id string) (string, []any) {
	return c.past(at, id, ">")
}

func (c Cursor) past(at, id, cmp string) (string, []any) {
	if c.IsZero() {
		return "1 = 1", nil
	}
	t := toMillis(c.CreatedAt)
	return "(" + at + " " + cmp + " ? OR (" + at + " = ? AND " + id + " " + cmp + " ?))", []any{t, t, c.ID}
}
