package microvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/digitalocean/go-qemu/qmp"

	"github.com/sandboxd/sandboxd/internal/runtime/host"
)

// monitor is a QMP connection to one QEMU: go-qemu's socket monitor (the
// handshake, replies told apart from events, descriptors passed with
// SCM_RIGHTS) with typed commands for what this backend uses and
// cancellation, which go-qemu lacks: a context ending disconnects, and a
// disconnected monitor fails every call.
type monitor struct {
	mon *qmp.SocketMonitor
}

// dialMonitor connects to QEMU's QMP socket, waiting for QEMU to create it.
func dialMonitor(ctx context.Context, path string) (*monitor, error) {
	for {
		name, release, err := host.UnixPath(path)
		if err != nil {
			return nil, fmt.Errorf("dial qmp: %w", err)
		}
		mon, err := qmp.NewSocketMonitor("unix", name, 2*time.Second)
		release()
		if err == nil {
			m := &monitor{mon: mon}
			if err := m.do(ctx, mon.Connect); err != nil {
				return nil, fmt.Errorf("qmp handshake: %w", err)
			}
			return m, nil
		}
		if !errors.Is(err, os.ErrNotExist) && !isConnRefused(err) {
			return nil, fmt.Errorf("dial qmp: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial qmp: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// do runs f, disconnecting the monitor if ctx ends first (which makes f
// return).
func (m *monitor) do(ctx context.Context, f func() error) error {
	stop := context.AfterFunc(ctx, func() { _ = m.mon.Disconnect() })
	err := f()
	if !stop() {
		return ctx.Err()
	}
	return err
}

func isConnRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

func (m *monitor) close() { _ = m.mon.Disconnect() }

type qmpCommand struct {
	Execute   string `json:"execute"`
	Arguments any    `json:"arguments,omitempty"`
}

// run executes a command and decodes its "return" into out (if not nil).
func (m *monitor) run(ctx context.Context, out any, command string, args any) error {
	return m.runFile(ctx, out, nil, command, args)
}

// runFile is run with f passed along as an SCM_RIGHTS descriptor.
func (m *monitor) runFile(ctx context.Context, out any, f *os.File, command string, args any) error {
	b, err := json.Marshal(qmpCommand{Execute: command, Arguments: args})
	if err != nil {
		return err
	}
	var reply []byte
	err = m.do(ctx, func() error {
		var err error
		if f != nil {
			reply, err = m.mon.RunWithFile(b, f)
		} else {
			reply, err = m.mon.Run(b)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("qmp %s: %w", command, err)
	}
	if out == nil {
		return nil
	}
	var r struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(reply, &r); err != nil {
		return fmt.Errorf("qmp %s: decode reply: %w", command, err)
	}
	if err := json.Unmarshal(r.Return, out); err != nil {
		return fmt.Errorf("qmp %s: decode reply: %w", command, err)
	}
	return nil
}

// status is the VM's run state ("running", "paused", "inmigrate", ...).
func (m *monitor) status(ctx context.Context) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	err := m.run(ctx, &st, "query-status", nil)
	return st.Status, err
}

func (m *monitor) cont(ctx context.Context) error { return m.run(ctx, nil, "cont", nil) }
func (m *monitor) stop(ctx context.Context) error { return m.run(ctx, nil, "stop", nil) }
func (m *monitor) quit(ctx context.Context) error { return m.run(ctx, nil, "quit", nil) }

// migrateToFile writes the stopped VM's state (devices and memory) to f and
// waits until it is complete.
func (m *monitor) migrateToFile(ctx context.Context, f *os.File) error {
	if err := m.runFile(ctx, nil, f, "getfd", map[string]string{"fdname": "snapshot"}); err != nil {
		return err
	}
	if err := m.run(ctx, nil, "migrate", map[string]string{"uri": "fd:snapshot"}); err != nil {
		return err
	}
	for {
		var info struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := m.run(ctx, &info, "query-migrate", nil); err != nil {
			return err
		}
		switch info.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", info.Status, info.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			_ = m.run(context.Background(), nil, "migrate_cancel", nil)
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// migrateFromFile loads a VM started with -incoming defer from f and waits
// until the state is loaded.
func (m *monitor) migrateFromFile(ctx context.Context, f *os.File) error {
	if err := m.runFile(ctx, nil, f, "getfd", map[string]string{"fdname": "snapshot"}); err != nil {
		return err
	}
	if err := m.run(ctx, nil, "migrate-incoming", map[string]string{"uri": "fd:snapshot"}); err != nil {
		return err
	}
	return m.waitIncoming(ctx)
}

// waitIncoming waits until an -incoming VM has loaded its state.
func (m *monitor) waitIncoming(ctx context.Context) error {
	for {
		st, err := m.status(ctx)
		if err != nil {
			return err
		}
		if st != "inmigrate" {
			if st == "paused" || st == "prelaunch" || st == "running" {
				return nil
			}
			var info struct {
				Status    string `json:"status"`
				ErrorDesc string `json:"error-desc"`
			}
			_ = m.run(ctx, &info, "query-migrate", nil)
			return fmt.Errorf("restore memory snapshot: VM is %s (%s %s)", st, info.Status, info.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}
