package templatespec

import (
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

func keySteps() []Step {
	return []Step{
		{Kind: StepRun, Command: "apt-get install -y curl", User: "root"},
		{Kind: StepCopy, Src: "app", Dest: "/app", FilesHash: hashA, Mode: 0o755},
		{Kind: StepEnv, Env: []EnvVar{{"A", "1"}}},
		{Kind: StepWorkdir, Path: "/app"},
		{Kind: StepRun, Command: "make"},
	}
}

func mustKeys(t *testing.T, digest string, steps []Step) []string {
	t.Helper()
	k, err := CacheKeys(digest, steps)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestCacheKeysChangeFromTheChangedStepOn(t *testing.T) {
	const digest = "sha256:1111"
	base := mustKeys(t, digest, keySteps())
	if len(base) != 5 {
		t.Fatalf("%d keys for 5 steps", len(base))
	}
	seen := map[string]bool{}
	for _, k := range base {
		if len(k) != 64 || seen[k] {
			t.Fatalf("keys %v: not 64 hex digits each, or not distinct", base)
		}
		seen[k] = true
	}
	if again := mustKeys(t, digest, keySteps()); !equal(again, base) {
		t.Fatal("the same definition gives other keys")
	}

	tests := []struct {
		name     string
		change   func(s []Step)
		digest   string
		firstNew int // keys before it are reused, it and after are new
	}{
		{"last step only", func(s []Step) { s[4].Command = "make all" }, digest, 4},
		{"copied files", func(s []Step) { s[1].FilesHash = "0" + hashA[1:] }, digest, 1},
		{"copy mode", func(s []Step) { s[1].Mode = 0o644 }, digest, 1},
		{"run user", func(s []Step) { s[0].User = "" }, digest, 0},
		{"env value", func(s []Step) { s[2].Env[0].Value = "2" }, digest, 2},
		{"base digest", func(s []Step) {}, "sha256:2222", 0},
		{"line and force do not count", func(s []Step) { s[3].Line = 9; s[3].Force = true }, digest, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := keySteps()
			tt.change(s)
			got := mustKeys(t, tt.digest, s)
			for i := range got {
				if reused := got[i] == base[i]; reused != (i < tt.firstNew) {
					t.Errorf("key %d reused=%v, want reused only before step %d", i, reused, tt.firstNew)
				}
			}
		})
	}
}

func TestCacheKeysAreUnambiguous(t *testing.T) {
	// The same bytes split differently between fields must not collide.
	a := mustKeys(t, "d", []Step{{Kind: StepEnv, Env: []EnvVar{{"AB", "C"}}}})
	b := mustKeys(t, "d", []Step{{Kind: StepEnv, Env: []EnvVar{{"A", "BC"}}}})
	c := mustKeys(t, "d", []Step{{Kind: StepArg, Env: []EnvVar{{"AB", "C"}}}})
	if a[0] == b[0] || a[0] == c[0] {
		t.Error("different steps share a key")
	}
}

func TestCacheKeysRefuse(t *testing.T) {
	if _, err := CacheKeys("", keySteps()); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("no digest: %v", err)
	}
	s := keySteps()
	s[1].FilesHash = ""
	if _, err := CacheKeys("d", s); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("COPY without files hash: %v", err)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
