package templatespec

import (
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// Whatever the input, the readers return a valid Template or an error of
// a class the edge can explain; they never panic. `go test` runs the
// seeds; `go test -fuzz FuzzParseDockerfile` searches further.
func FuzzParseDockerfile(f *testing.F) {
	for _, s := range []string{
		"FROM a\nRUN x",
		"ARG I=a\nFROM $I\nENV A=${B:-c} D=\"e f\"\nCOPY --chown=u:g --chmod=700 a b /c/\nCMD [\"x\"]",
		"# escape=`\nFROM a\nRUN a `\n b",
		"FROM a\nRUN <<EOF\nx\nEOF",
		"FROM a\nENV A=${A//x/yy}",
		"FROM a AS b\nFROM c",
	} {
		f.Add(s)
	}
	lim := Limits{DockerfileBytes: 4096, LineBytes: 512, EnvValueBytes: 256, EnvBytes: 1024}
	f.Fuzz(func(t *testing.T, df string) {
		tpl, err := ParseDockerfile([]byte(df), ParseOptions{Limits: lim})
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrTooLarge) {
				t.Fatalf("error without a class: %v", err)
			}
			return
		}
		if err := tpl.Validate(lim); err != nil {
			t.Fatalf("returned an invalid template: %v", err)
		}
	})
}

func FuzzFromJSON(f *testing.F) {
	f.Add(sdkBody)
	f.Add(`{"fromTemplate": "base", "steps": [{"type": "env", "args": ["A", "1"]}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		tpl, err := FromJSON([]byte(body), Limits{})
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrTooLarge) {
				t.Fatalf("error without a class: %v", err)
			}
			return
		}
		if err := tpl.Validate(Limits{}); err != nil {
			t.Fatalf("returned an invalid template: %v", err)
		}
	})
}
