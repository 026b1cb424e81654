package main

import (
	"bytes"
	"strings"
	"testing"
)

// runRootStdin is runRoot with stdin.
func runRootStdin(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := newRootCmd()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(args)
	_, err = root.ExecuteC()
	return out.String(), errb.String(), err
}

// TestTemplateBuildRegistry: the registry's secret comes from stdin or
// the environment, never a flag, and goes in the build's registry object;
// flags that do not go together are refused before any request.
func TestTemplateBuildRegistry(t *testing.T) {
	a := newTemplateAPI(t)
	t.Setenv(envRegistryPassword, "")
	t.Setenv(envRegistryToken, "")
	build := []string{"template", "build", "py", "--image", "registry.example/library/python:3.12", "--json"}
	with := func(more ...string) []string { return append(append([]string{}, build...), more...) }

	if _, errOut, err := runRootStdin(t, "s3cret-pw\n", with("--registry-username", "bot", "--registry-password-stdin")...); err != nil {
		t.Fatalf("--registry-password-stdin: %v\n%s", err, errOut)
	}
	if got := a.last(); got != `POST /api/templates {"name":"py","image":"registry.example/library/python:3.12","registry":{"username":"bot","password":"s3cret-pw"}}` {
		t.Errorf("sent %q", got)
	}

	t.Setenv(envRegistryPassword, "env-pw")
	if _, errOut, err := runRootStdin(t, "", with("--registry-username", "bot")...); err != nil {
		t.Fatalf("%s: %v\n%s", envRegistryPassword, err, errOut)
	}
	if got := a.last(); !strings.HasSuffix(got, `"registry":{"username":"bot","password":"env-pw"}}`) {
		t.Errorf("sent %q", got)
	}
	t.Setenv(envRegistryPassword, "")

	if _, errOut, err := runRootStdin(t, "tok-123\r\n", with("--registry-token-stdin")...); err != nil {
		t.Fatalf("--registry-token-stdin: %v\n%s", err, errOut)
	}
	if got := a.last(); !strings.HasSuffix(got, `"registry":{"token":"tok-123"}}`) {
		t.Errorf("sent %q", got)
	}
	t.Setenv(envRegistryToken, "env-tok")
	if _, errOut, err := runRootStdin(t, "", build...); err != nil {
		t.Fatalf("%s: %v\n%s", envRegistryToken, err, errOut)
	}
	if got := a.last(); !strings.HasSuffix(got, `"registry":{"token":"env-tok"}}`) {
		t.Errorf("sent %q", got)
	}
	t.Setenv(envRegistryToken, "")

	n := len(a.requests)
	for _, c := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"--registry-username", "bot"}, "--registry-username needs a password"},
		{"pw", []string{"--registry-password-stdin"}, "needs --registry-username"},
		{"pw", []string{"--registry-username", "bot", "--registry-password-stdin", "--registry-token-stdin"}, "not both"},
		{"tok", []string{"--registry-username", "bot", "--registry-token-stdin"}, "is a token alone"},
		{"\n", []string{"--registry-username", "bot", "--registry-password-stdin"}, "stdin holds no registry secret"},
		{strings.Repeat("x", 17<<10), []string{"--registry-token-stdin"}, "longer than"},
		{"", []string{"--registry-password", "pw"}, "unknown flag: --registry-password"},
	} {
		if _, _, err := runRootStdin(t, c.stdin, with(c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v; want %q", c.args, err, c.want)
		}
	}
	if _, _, err := runRootStdin(t, "FROM x\n", "template", "build", "py", "--dockerfile", "-", "--registry-username", "bot", "--registry-password-stdin"); err == nil || !strings.Contains(err.Error(), "stdin is read for the Dockerfile") {
		t.Errorf("stdin twice: %v", err)
	}
	if len(a.requests) != n {
		t.Errorf("refused flags sent requests: %q", a.requests[n:])
	}
}
