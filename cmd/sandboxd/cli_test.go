package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// runRoot runs the whole command tree as main does, and returns what it
// printed and the error main would report.
func runRoot(t *testing.T, args ...string) (stdout, stderr string, cmd *cobra.Command, err error) {
	t.Helper()
	root := newRootCmd()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(args)
	cmd, err = root.ExecuteC()
	return out.String(), errb.String(), cmd, err
}

// TestUnknownSubcommands: a command that is not there is an error with a
// suggestion, at every level, where cobra printed its parent's help and
// succeeded; a group alone still prints its help.
func TestUnknownSubcommands(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "lsit"}, "unknown command \"lsit\" for \"sandboxd sandbox\"\n\nDid you mean this?\n\tls\n"},
		{[]string{"admin", "account", "ls"}, "Did you mean this?\n\tlist\n"},
		{[]string{"sandbox", "logz", "run_1"}, "Did you mean this?\n\tlogs\n"},
		{[]string{"frobnicate"}, "unknown command \"frobnicate\" for \"sandboxd\""},
		{[]string{"sandbox", "logs"}, "accepts 1 arg(s), received 0"},
	} {
		_, _, _, err := runRoot(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.args, err, c.want)
		}
	}
	t.Setenv("SANDBOXD_API_KEY", "")
	if out, _, _, err := runRoot(t, "sandbox"); err != nil || !strings.Contains(out, "Available Commands:") {
		t.Errorf("sandbox alone: %v\n%s", err, out)
	}
}

// TestHelpShowsItsOwnFlags: the client's commands list their flags and
// the client's, not the server's data and log flags; each has examples.
func TestHelpShowsItsOwnFlags(t *testing.T) {
	out, _, _, err := runRoot(t, "sandbox", "exec", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--timeout", "--stdin", "--keep-running", "--url", "--key", "--json", "Examples:"} {
		if !strings.Contains(out, want) {
			t.Errorf("exec --help lacks %s:\n%s", want, out)
		}
	}
	for _, unwanted := range []string{"--data-dir", "--database", "--cache-dir", "--log-level"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("exec --help shows %s, which it does not use:\n%s", unwanted, out)
		}
	}
	if out, _, _, _ := runRoot(t, "serve", "--help"); !strings.Contains(out, "--data-dir") {
		t.Errorf("serve --help lost --data-dir:\n%s", out)
	}
	if out, _, _, _ := runRoot(t, "version", "--help"); strings.Contains(out, "--data-dir") {
		t.Errorf("version --help shows --data-dir:\n%s", out)
	}
}

// TestEveryCommandHasAnExample: every command a user runs shows an
// example in its help, and no example is kept for a command that went.
func TestEveryCommandHasAnExample(t *testing.T) {
	seen := map[string]bool{}
	walk(newRootCmd(), func(c *cobra.Command) {
		seen[c.CommandPath()] = true
		if c.Runnable() && !c.HasSubCommands() && !c.Hidden && c.Name() != "help" && c.Example == "" {
			t.Errorf("%s has no example", c.CommandPath())
		}
	})
	for path := range examples {
		if !seen[path] {
			t.Errorf("an example is kept for %s, which is not a command", path)
		}
	}
}

// TestErrorsAsJSON: a command asked for JSON (by --json or SANDBOXD_JSON)
// reports its failure as one JSON object with the API's status.
func TestErrorsAsJSON(t *testing.T) {
	var buf bytes.Buffer
	reportError(&buf, &client.Error{StatusCode: 404, Body: client.ErrorBody{Error: "Sandbox not found"}}, true)
	if buf.String() != `{"error":"Sandbox not found","status":404}`+"\n" {
		t.Errorf("API error: %s", buf.String())
	}
	buf.Reset()
	reportError(&buf, errors.New("no API key"), true)
	if buf.String() != `{"error":"no API key"}`+"\n" {
		t.Errorf("other error: %s", buf.String())
	}
	buf.Reset()
	reportError(&buf, errors.New("no API key"), false)
	if buf.String() != "sandboxd: no API key\n" {
		t.Errorf("text: %s", buf.String())
	}

	t.Setenv("SANDBOXD_API_KEY", "")
	_, _, cmd, err := runRoot(t, "sandbox", "ls", "--json")
	if err == nil || !wantsJSON(cmd) {
		t.Errorf("ls --json without a key: %v, JSON %v", err, wantsJSON(cmd))
	}
	t.Setenv("SANDBOXD_JSON", "true")
	if _, _, cmd, _ := runRoot(t, "sandbox", "lsit"); !wantsJSON(cmd) {
		t.Error("SANDBOXD_JSON=true: not JSON")
	}
	t.Setenv("SANDBOXD_JSON", "")
	if _, _, cmd, _ := runRoot(t, "sandbox", "ls"); wantsJSON(cmd) {
		t.Error("no --json: JSON")
	}
}

// TestVersionJSON: version --json is an object with the version.
func TestVersionJSON(t *testing.T) {
	out, _, _, err := runRoot(t, "version", "--json")
	var v struct{ Version, Go string }
	if err != nil || json.Unmarshal([]byte(out), &v) != nil || v.Version != "dev" || !strings.HasPrefix(v.Go, "go") {
		t.Fatalf("version --json: %v %q", err, out)
	}
}

// TestCompleteSandboxIDs: the shell completes a sandbox id from the API
// (live ones where only those make sense, each with its status), and
// completes nothing, quietly, when the API cannot be reached.
func TestCompleteSandboxIDs(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("x-api-key") != "sbx_k" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"success","sandboxes":[`+
			`{"sandboxId":"sbx_live","sandboxStatus":"running","timeout":1,"createdAt":"2026-01-02T03:04:05Z"},`+
			`{"sandboxId":"sbx_gone","sandboxStatus":"stopped","timeout":0,"createdAt":"2026-01-02T03:04:05Z"},`+
			`{"sandboxId":"other","sandboxStatus":"running","timeout":1,"createdAt":"2026-01-02T03:04:05Z"}],`+
			`"snapshot_id":null,"github_repo":null,"filetree":null}`)
	}))
	defer srv.Close()
	t.Setenv("SANDBOXD_URL", srv.URL)
	t.Setenv("SANDBOXD_API_KEY", "sbx_k")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "exec", "sbx"}, "sbx_live\trunning\n:4\n"},
		{[]string{"sandbox", "rm", "sbx"}, "sbx_live\trunning\nsbx_gone\tstopped\n:4\n"},
		{[]string{"sandbox", "cp", "./x", "sbx_l"}, "sbx_live:\trunning\n:2\n"},
		{[]string{"sandbox", "--key", "wrong", "stop", ""}, ":4\n"},
	} {
		out, _, _, err := runRoot(t, append([]string{cobra.ShellCompRequestCmd}, c.args...)...)
		if got, _, _ := strings.Cut(out, "Completion ended"); err != nil || got != c.want {
			t.Errorf("complete %q: %v %q, want %q", c.args, err, out, c.want)
		}
	}
}
