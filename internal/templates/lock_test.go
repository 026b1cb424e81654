package templates

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestLockDigest: one holder per digest at a time, other digests never
// wait, a waiter gives up with its context, and a lock file removed by
// its holder (the digest collected) leaves no two holders: the waiter
// that got the removed file's lock takes the path's new one.
func TestLockDigest(t *testing.T) {
	dir := t.TempDir()
	ctx := t.Context()
	const d1, d2 = "sha256:11", "sha256:22"
	unlock1, err := lockDigest(ctx, dir, d1)
	if err != nil {
		t.Fatal(err)
	}
	unlock2, err := lockDigest(ctx, dir, d2) // another digest: at once
	if err != nil {
		t.Fatal(err)
	}
	unlock2()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := lockDigest(short, dir, d1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second holder: %v", err)
	}

	got := make(chan func(), 1)
	go func() {
		u, err := lockDigest(ctx, dir, d1)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- u
	}()
	time.Sleep(150 * time.Millisecond) // the waiter has the old file open
	if err := removeLockFile(dir, d1); err != nil {
		t.Fatal(err)
	}
	unlock1()
	waiter := <-got
	// The waiter holds the lock: nobody else gets it.
	short2, cancel2 := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel2()
	if _, err := lockDigest(short2, dir, d1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("two holders after a removal: %v", err)
	}
	waiter()
	u, err := lockDigest(ctx, dir, d1)
	if err != nil {
		t.Fatal(err)
	}
	u()
}
