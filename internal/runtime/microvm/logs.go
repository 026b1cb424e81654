package microvm

import (
	"context"
	"io/fs"

	"os"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/caplog"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
)

// The VM's logs, in the sandbox's directory and out of the jail's reach.
// The guest writes its serial console into a socket chardev that sandboxd
// reads (a disconnected one drops what it is sent: QEMU neither blocks nor
// grows a file while sandboxd is away), and QEMU writes its own messages
// into a pipe sandboxd drains (see caplog); both end in capped files.
const (
	consoleLog = "console.log"
	qemuLog    = "qemu.log"
	qemuFIFO   = "qemu.fifo"
)

// startLogs drains the console and QEMU's messages of the QEMU process
// (pid, start) into their capped logs until it exits or detach. The channel
// is closed once the console is connected (or draining ended): output from
// then on is kept, so boot waits for it before the VM runs.
func (s *sandbox) startLogs(pid int, start uint64) <-chan struct{} {
	ctx, cancel := context.WithCancel(s.r.Context())
	s.Mu.Lock()
	if s.logCancel != nil {
		s.logCancel()
	}
	s.logCancel = cancel
	s.Mu.Unlock()
	connected := make(chan struct{})
	go s.drainConsole(ctx, waitExit(ctx, pid, start), connected)
	go s.DrainLog(ctx, qemuFIFO, qemuLog)
	return connected
}

func (s *sandbox) drainConsole(ctx context.Context, exited <-chan struct{}, connected chan struct{}) {
	var once sync.Once
	signal := func() { once.Do(func() { close(connected) }) }
	defer signal()
	sock := s.jail(strings.TrimPrefix(jailConsole, "/"))
	w, err := caplog.Open(s.Path(consoleLog), s.r.opts.LogMaxBytes)
	if err != nil {
		s.r.log.Warn("console log not kept", "cid", s.Meta().CID, "err", err)
		return
	}
	defer w.Close()
	defer func() {
		if d := w.Dropped(); d > 0 {
			s.r.log.Info("console log capped", "cid", s.Meta().CID, "dropped_bytes", d)
		}
	}()
	for ctx.Err() == nil {
		if st, err := os.Lstat(sock); err == nil && st.Mode().Type() != fs.ModeSocket {
			return // a file chardev of an older sandboxd
		}
		conn, err := host.DialUnix(ctx, sock)
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-exited:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		signal()
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		// EOF when QEMU exits.
		_, _ = w.ReadFrom(conn)
		stop()
		conn.Close()
	}
}
