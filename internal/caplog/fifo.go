package caplog

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// A process that outlives sandboxd (runsc's sandbox, QEMU) cannot be given
// a Writer: it writes to a file descriptor. It is given the write end of a
// named pipe instead, which sandboxd drains into a Writer (Drain) and which
// a later sandboxd opens again after a restart.
//
// The write end is opened read-write and non-blocking (WriteEnd): holding a
// reader itself, the writer never sees EPIPE (nor SIGPIPE, which would kill
// it) while no sandboxd drains the pipe; once the pipe's buffer is full, its
// writes fail with EAGAIN (its output is lost, the process goes on) — or,
// for a writer that waits for the pipe to be writable again, they wait until
// sandboxd is back.

// pipeSize is the pipe buffer asked for: what a writer can put out while
// sandboxd is away before losing output.
const pipeSize = 1 << 20

// MakeFIFO creates the named pipe at path (mode 0600), replacing a stale
// file of another kind.
func MakeFIFO(path string) error {
	if st, err := os.Lstat(path); err == nil {
		if st.Mode().Type() == fs.ModeNamedPipe {
			return nil
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("make log pipe: %w", err)
		}
	}
	if err := unix.Mkfifo(path, 0o600); err != nil {
		return fmt.Errorf("make log pipe %s: %w", path, err)
	}
	return nil
}

// WriteEnd opens the pipe at path as a writer's stdout and stderr (see
// above). The caller passes it to the writing process and closes its own
// copy.
func WriteEnd(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open log pipe %s: %w", path, err)
	}
	_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, pipeSize) // best effort
	return os.NewFile(uintptr(fd), path), nil
}

// Drain copies what is written into the pipe at path into w until every
// writer has closed it (nil) or ctx ends (ctx's error). It does not close w.
func Drain(ctx context.Context, path string, w *Writer) error {
	st, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("drain log pipe: %w", err)
	}
	if st.Mode().Type() != fs.ModeNamedPipe {
		return fmt.Errorf("drain log pipe %s: not a named pipe", path)
	}
	// Non-blocking: opening does not wait for a writer, and reads go
	// through the runtime's poller, so Close ends a pending Read.
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("drain log pipe: %w", err)
	}
	// Not f.Fd(): it would make the descriptor blocking.
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, pipeSize) })
	}
	stop := context.AfterFunc(ctx, func() { f.Close() })
	defer stop()
	defer f.Close()
	_, err = w.ReadFrom(f)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}

// Pipe makes the log pipe at path (MakeFIFO) and opens its write end
// (WriteEnd), for a writer that starts now.
func Pipe(path string) (*os.File, error) {
	if err := MakeFIFO(path); err != nil {
		return nil, err
	}
	return WriteEnd(path)
}
