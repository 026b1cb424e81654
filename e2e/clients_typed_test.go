package e2e

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	client "github.com/sandboxd/sandboxd/clients/go"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestTypedClients runs the clients generated from the served OpenAPI
// document against a real server: the Go client (package client) here,
// and the TypeScript package (clients/typescript) through its node tests.
// Each creates a sandbox with a command, follows its run, execs in it,
// lists, reads the file the run committed and stops it, then meets the
// API's errors as its typed error: a wrong key (401), another account's
// sandbox (404), a bad body (400 naming the field), a stopped sandbox
// (409, a status the document does not list).
//
// The server runs the minimal Debian image (imageServer), whose git commits
// the run's work to the account's repository for the file routes to read.
func TestTypedClients(t *testing.T) {
	s := imageServer(t, storetest.SQLiteDSN(t))
	t.Run("go", func(t *testing.T) {
		k := s.createKey(s.createAccount("typed-go", false).ID)
		other := s.createKey(s.createAccount("typed-go-other", false).ID)
		goClient(t, s.base, k.Key, other.Key)
	})
	t.Run("typescript", func(t *testing.T) {
		node := findNode(t)
		dir, err := filepath.Abs(filepath.Join("..", "clients", "typescript"))
		if err != nil {
			t.Fatal(err)
		}
		npmCI(t, node, dir)
		k := s.createKey(s.createAccount("typed-ts", false).ID)
		other := s.createKey(s.createAccount("typed-ts-other", false).ID)
		npm, err := node.npm()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// npm test compiles the package and its tests (a type error in
		// either fails here), then checks that src/schema.ts is what
		// openapi-typescript makes of api/openapi.json now, then runs the
		// calls against this server.
		env := map[string]string{"SANDBOXD_URL": s.base, "SANDBOXD_API_KEY": k.Key, "SANDBOXD_OTHER_API_KEY": other.Key}
		if err := node.run(ctx, t, dir, env, npm, "test"); err != nil {
			t.Fatalf("npm test in %s: %v", dir, err)
		}
	})
}

// goClient is the Go client's half of TestTypedClients.
func goClient(t *testing.T, base, key, otherKey string) {
	ctx := t.Context()
	c, err := client.New(base, key)
	if err != nil {
		t.Fatal(err)
	}

	cmd, args := "sh", []string{"-c", "echo typed > typed.txt"}
	created, err := client.Check(c.PostSandboxesWithResponse(ctx, client.CreateSandboxRequest{Command: &cmd, Args: &args}))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	sb := created.JSON200.Sandboxes[0]
	if sb.SandboxStatus != client.SandboxSandboxStatusRunning || sb.RunID == nil {
		t.Fatalf("created %+v", sb)
	}
	id := sb.SandboxID

	// The run commits typed.txt to the account's repository.
	var run client.Run
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		runs, err := client.Check(c.GetTasksRunsWithResponse(ctx, &client.GetTasksRunsParams{RunID: sb.RunID}))
		if err != nil {
			t.Fatalf("get run: %v", err)
		}
		if run = runs.JSON200.Runs[0]; run.IsCompleted || time.Now().After(deadline) {
			break
		}
	}
	if run.Status != client.RunStatusCOMPLETED || run.Output == nil || (*run.Output)["exitCode"] != 0.0 {
		t.Fatalf("run %+v", run)
	}

	execArgs := []string{"typed.txt"}
	ex, err := client.Check(c.PostSandboxesIDExecWithResponse(ctx, id, client.ExecRequest{Command: "cat", Args: &execArgs}))
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	if ex.JSON200.ExitCode != 0 || ex.JSON200.Stdout != "typed\n" {
		t.Fatalf("exec %+v", ex.JSON200)
	}

	list, err := client.Check(c.GetSandboxesWithResponse(ctx, nil))
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	if !slices.ContainsFunc(list.JSON200.Sandboxes, func(s client.Sandbox) bool {
		return s.SandboxID == id && s.SandboxStatus == client.SandboxSandboxStatusRunning
	}) {
		t.Fatalf("list has no running %s: %+v", id, list.JSON200.Sandboxes)
	}
	if list.JSON200.Filetree == nil || !slices.ContainsFunc(*list.JSON200.Filetree, func(e client.TreeEntry) bool { return e.Path == "typed.txt" }) {
		t.Fatalf("file tree without typed.txt: %+v", list.JSON200.Filetree)
	}

	file, err := client.Check(c.GetSandboxesFileWithResponse(ctx, &client.GetSandboxesFileParams{Path: "typed.txt"}))
	if err != nil {
		t.Fatalf("read file: %v", err)
	}
	if file.JSON200.Content != "typed\n" || file.JSON200.Encoding != nil {
		t.Fatalf("file %+v", file.JSON200)
	}

	// Errors, each a *client.Error with the status and the API's body.
	wantError := func(what string, err error, status int, message string, fields ...any) {
		t.Helper()
		var e *client.Error
		if !errors.As(err, &e) {
			t.Fatalf("%s: %v (%T), want a *client.Error", what, err, err)
		}
		if e.StatusCode != status || e.Body.Status != client.ErrorBodyStatusError || (message != "" && e.Body.Error != message) {
			t.Fatalf("%s: %d %+v, want %d %q", what, e.StatusCode, e.Body, status, message)
		}
		if fields != nil && (e.Body.MissingFields == nil || !slices.Equal(*e.Body.MissingFields, fields)) {
			t.Fatalf("%s: missing_fields %v, want %v", what, e.Body.MissingFields, fields)
		}
	}
	wrong, err := client.New(base, "sbx_not_a_key")
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Check(wrong.GetSandboxesWithResponse(ctx, nil))
	wantError("a wrong key", err, 401, "Unauthorized")

	otherClient, err := client.New(base, otherKey)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Check(otherClient.PostSandboxesIDExecWithResponse(ctx, id, client.ExecRequest{Command: "true"}))
	wantError("another account's sandbox", err, 404, "Sandbox not found")
	_, err = client.Check(otherClient.GetSandboxesFileWithResponse(ctx, &client.GetSandboxesFileParams{Path: "typed.txt"}))
	wantError("another account's file", err, 404, "")

	_, err = client.Check(c.PostSandboxesIDExecWithResponse(ctx, id, client.ExecRequest{Command: ""}))
	wantError("an empty command", err, 400, "command cannot be empty", "command")

	stopped, err := client.Check(c.PostSandboxesIDStopWithResponse(ctx, id, client.AccountRequest{}))
	if err != nil {
		t.Fatalf("stop: %v", err)
	}
	if st := stopped.JSON200.Sandbox.SandboxStatus; st != client.SandboxSandboxStatusStopped && st != client.SandboxSandboxStatusStopping {
		t.Fatalf("stopped sandbox is %s", st)
	}
	_, err = client.Check(c.PostSandboxesIDExecWithResponse(ctx, id, client.ExecRequest{Command: "true"}))
	wantError("exec in a stopped sandbox", err, 409, "")
}
