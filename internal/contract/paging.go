package contract

import "github.com/sandboxd/sandboxd/internal/store"

// Paging of GET /api/sandboxes and GET /api/tasks/runs (sandboxd). The
// original answered every sandbox an account ever had in one list; its
// clients send neither limit nor cursor and get the list's own shape, cut
// at UnpagedSandboxes but never without a live sandbox. A client that
// pages follows the X-Next-Cursor header: a header, so that the body
// keeps the original's shape exactly.
const (
	// NextCursorHeader carries the cursor of the page after this one;
	// absent on the last page.
	NextCursorHeader = "X-Next-Cursor"
	// UnpagedSandboxes is how many of an account's newest sandboxes GET
	// /api/sandboxes lists without limit and cursor, beside every active
	// one: what a client shows of the account's recent work, in an answer
	// bounded whatever its history.
	UnpagedSandboxes = 100
	// MaxSandboxPage is the largest (and the default) page of sandboxes.
	MaxSandboxPage = 100
)

// QueryCursor decodes a cursor parameter ("": the list's start).
func QueryCursor(s string) (store.Cursor, error) {
	c, err := store.ParseCursor(s)
	if err != nil {
		return c, BadRequest("cursor must be the X-Next-Cursor of an earlier page")
	}
	return c, nil
}

// Paged says the list is paged: limit or cursor was given.
func (q ListSandboxesQuery) Paged() bool { return q.paged }

// After is the decoded cursor: where the page begins.
func (q ListSandboxesQuery) After() store.Cursor { return q.after }

// After is the decoded cursor: where the page begins.
func (q RunsQuery) After() store.Cursor { return q.after }
