package templatespec

import (
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

func TestParseRef(t *testing.T) {
	good := map[string]Ref{
		"my-env":           {"my-env", "latest"},
		"my-env:v1.0":      {"my-env", "v1.0"},
		"py_3.12:Stable-2": {"py_3.12", "Stable-2"},
		"a":                {"a", "latest"},
		"0:0":              {"0", "0"},
		strings.Repeat("n", 63) + ":" + strings.Repeat("T", 128): {strings.Repeat("n", 63), strings.Repeat("T", 128)},
	}
	for in, want := range good {
		got, err := ParseRef(in)
		if err != nil || got != want {
			t.Errorf("ParseRef(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if s := (Ref{"a", "b"}).String(); s != "a:b" {
		t.Errorf("String = %q", s)
	}
	bad := map[string]string{
		"":                              "template name is empty",
		":v1":                           "template name is empty",
		"env:":                          "the tag after ':' is empty",
		"My-Env":                        "must start and end with a lower-case letter",
		"my-Env":                        `"E" is not allowed`,
		"-env":                          "must start and end",
		"env-":                          "must start and end",
		"team/env":                      `"/" is not allowed`,
		"env:v1:v2":                     `tag "v1:v2": ":" is not allowed`,
		"env:.hidden":                   "must not start with '.' or '-'",
		"env:-x":                        "must not start with '.' or '-'",
		"env@sha256:abc":                `"@" is not allowed`,
		strings.Repeat("n", 64):         "longer than 63",
		"n:" + strings.Repeat("t", 129): "longer than 128",
		"ünïcode":                       "must start and end",
	}
	for in, want := range bad {
		_, err := ParseRef(in)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(msg(err), want) {
			t.Errorf("ParseRef(%q) = %v; want ErrInvalid saying %q", in, err, want)
		}
	}
}
