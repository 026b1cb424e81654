package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

func TestMessage(t *testing.T) {
	cause := errors.New("open /var/lib/sandboxd/tmp/x: no space left on device")
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"plain error hides its text", cause, "fallback"},
		{"user message with its context, without its cause", fmt.Errorf("capture: %w", Wrap(nil, cause, "the snapshot is larger than the 4096 MiB disk limit")), "capture: the snapshot is larger than the 4096 MiB disk limit"},
		{"context around a message without a cause", fmt.Errorf("clone r at main: %w", New(nil, "exit status 128: repository not found")), "clone r at main: exit status 128: repository not found"},
		{"new", New(nil, "opencode is not installed"), "opencode is not installed"},
		{"nil", nil, "fallback"},
	}
	for _, tt := range tests {
		if got := Message(tt.err, "fallback"); got != tt.want {
			t.Errorf("%s: Message = %q, want %q", tt.name, got, tt.want)
		}
	}
	if w := Wrap(nil, cause, "msg"); !errors.Is(w, cause) || w.Error() != "msg: "+cause.Error() {
		t.Errorf("Wrap keeps the cause for logs: %v", w)
	}
}

func TestClasses(t *testing.T) {
	cause := errors.New("statfs /data: input/output error")
	err := fmt.Errorf("github_repo: %w", Wrap(ErrInvalid, cause, "not the account's own mirror"))
	if !errors.Is(err, ErrInvalid) || !errors.Is(err, cause) || errors.Is(err, ErrQuota) {
		t.Fatalf("classes of %v", err)
	}
	if got := Message(err, "x"); got != "github_repo: not the account's own mirror" {
		t.Fatalf("Message = %q", got)
	}
	if got := Newf(ErrQuota, "%d of %d", 3, 2); !errors.Is(got, ErrQuota) || Message(got, "x") != "3 of 2" {
		t.Fatalf("Newf: %v", got)
	}
	if errors.Is(New(nil, "no class"), ErrInvalid) {
		t.Fatal("a message without a class matched a class")
	}
}
