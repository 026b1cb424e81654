// Package flock serialises work across processes with an exclusive flock on
// a lock file: the image and kernel caches use it so that two processes never
// build the same thing at once. flock locks belong to the open file, so a
// lock excludes other processes and other goroutines of this one alike, and
// the kernel drops it when its holder dies. Lock files are never removed:
// removing one while a process waits on it would let a third take a
// different lock on a new file.
package flock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// pollEvery is how often a waiting Lock tries again; polling (rather than a
// blocking flock) lets a wait end with its context.
const pollEvery = 200 * time.Millisecond

// Lock takes an exclusive lock on path (creating the file), waiting until
// it is free or ctx ends. waiting, if not nil, is called once when the lock
// is held by someone else, so the caller can say what it waits for.
func Lock(ctx context.Context, path string, waiting func()) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() {
				_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if waiting != nil {
			waiting()
			waiting = nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for lock %s: %w", path, ctx.Err())
		case <-time.After(pollEvery):
		}
	}
}
