package jobs_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestUI: River's UI works on the job client's database, SQLite and
// PostgreSQL alike: its page, and its API listing the queued jobs.
func TestUI(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st := storetest.Open(t, dsn)
		jc, err := jobs.New(ctx, st, jobs.Config{NodeID: "n1", PostgresDSN: dsn})
		if err != nil {
			t.Fatal(err)
		}
		defer jc.Close()
		if err := jc.Insert(ctx, jobs.StopSandboxArgs{SandboxID: "sbx_ui", Reason: "test"}, "n1"); err != nil {
			t.Fatal(err)
		}
		ui, err := jc.UI(ctx, "/riverui", slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		get := func(path string) (int, string) {
			rec := httptest.NewRecorder()
			ui.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			body, _ := io.ReadAll(rec.Result().Body)
			return rec.Code, string(body)
		}
		code, page := get("/riverui/")
		if code != 200 || !strings.Contains(page, "<title>River</title>") {
			t.Fatalf("page: %d %.300s", code, page)
		}
		// Its script comes from under the prefix too.
		script := regexp.MustCompile(`src="(/riverui/assets/[^"]+\.js)"`).FindStringSubmatch(page)
		if script == nil {
			t.Fatalf("no script under /riverui/assets in %.500s", page)
		}
		if code, body := get(script[1]); code != 200 || len(body) < 1000 {
			t.Fatalf("%s: %d, %d bytes", script[1], code, len(body))
		}
		code, body := get("/riverui/api/jobs?state=available&limit=10")
		if code != 200 || !strings.Contains(body, jobs.KindStopSandbox) || !strings.Contains(body, "node-n1") {
			t.Fatalf("jobs: %d %.500s", code, body)
		}
		// Queues are listed once a client working them started: this one
		// only inserts.
		if code, body := get("/riverui/api/queues"); code != 200 || !strings.Contains(body, `"data"`) {
			t.Fatalf("queues: %d %.500s", code, body)
		}
	})
}
