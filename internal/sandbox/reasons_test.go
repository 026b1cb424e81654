package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestStartFailure: the runtime's errors (which name host paths and
// runsc's logs) become reasons a user can read and act on; none of their
// text comes through.
func TestStartFailure(t *testing.T) {
	const logPath = "/var/lib/sandboxd/runtime/gvisor/sandboxes/abc/agent.log"
	diskFull := &fs.PathError{Op: "write", Path: "/var/lib/sandboxd/runtime/gvisor/sandboxes/abc/layer", Err: syscall.ENOSPC}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"disk full", fmt.Errorf("restore layer 0: %w", diskFull), reasonNoDisk},
		{"quota", fmt.Errorf("mount overlay: %w", syscall.EDQUOT), reasonNoDisk},
		{"memory", fmt.Errorf("runsc run: fork: %w", syscall.ENOMEM), reasonNoMemory},
		{"agent never answered", fmt.Errorf("wait for agent: %w", context.DeadlineExceeded), reasonStartTimeout},
		{"a refusal for the user", fmt.Errorf("create: %w", errdefs.Wrap(errdefs.ErrInvalid, errors.New("stat "+logPath), "the image has no /bin/sh")), "the image has no /bin/sh"},
		{"anything else", fmt.Errorf("runsc run: exit status 128: error executing umounter (more in %s)", logPath), reasonStartGeneric},
	}
	for _, tt := range tests {
		got := startFailure(tt.err, reasonStartGeneric)
		if got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
		if strings.Contains(got, "/var/lib") || strings.Contains(got, "runsc") {
			t.Errorf("%s: %q shows the runtime's error", tt.name, got)
		}
	}
}

// TestCreateFailureSaysWhyInWords: a create the runtime fails for a full
// disk leaves a failed row whose reason says so, without the error's paths.
func TestCreateFailureSaysWhyInWords(t *testing.T) {
	p := newPlane(t, Settings{})
	p.rt.FailCreate(func(runtime.Spec) error {
		return fmt.Errorf("restore layer 0: %w", &fs.PathError{Op: "write", Path: "/data/runtime/gvisor/sandboxes/x/layer/upper/f", Err: syscall.ENOSPC})
	})
	sb, _, err := p.m.Create(context.Background(), p.account.ID, CreateRequest{})
	if err == nil {
		t.Fatal("create succeeded")
	}
	if got := p.status(t, sb.ID); got.Status != store.SandboxFailed || got.FailureReason != reasonNoDisk {
		t.Fatalf("row %s %q, want failed: %q", got.Status, got.FailureReason, reasonNoDisk)
	}
}
