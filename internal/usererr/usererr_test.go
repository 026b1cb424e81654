package usererr

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
		{"user message with its context, without its cause", fmt.Errorf("capture: %w", Wrap(cause, "the snapshot is larger than the 4096 MiB disk limit")), "capture: the snapshot is larger than the 4096 MiB disk limit"},
		{"context around a message without a cause", fmt.Errorf("clone r at main: %w", New("exit status 128: repository not found")), "clone r at main: exit status 128: repository not found"},
		{"new", New("opencode is not installed"), "opencode is not installed"},
		{"nil", nil, "fallback"},
	}
	for _, tt := range tests {
		if got := Message(tt.err, "fallback"); got != tt.want {
			t.Errorf("%s: Message = %q, want %q", tt.name, got, tt.want)
		}
	}
	if w := Wrap(cause, "msg"); !errors.Is(w, cause) || w.Error() != "msg: "+cause.Error() {
		t.Errorf("Wrap keeps the cause for logs: %v", w)
	}
}
