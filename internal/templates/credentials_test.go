package templates_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// syncBuffer is a log sink the build's goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBuildWithRegistryCredentials: a build from a registry that demands
// Basic auth pulls with the credentials it was given, also when another
// Service (a restarted server, with the same key file) runs it; a wrong
// password fails the build with a reason that says so. The credentials
// are sealed while the build waits and gone once it ends, and the
// password is nowhere: not in the database file, the rows, the build log,
// the failure reason or the server's log.
func TestBuildWithRegistryCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("unpacking an image keeps its owners: needs root")
	}
	ctx := t.Context()
	const user, password = "alice", "pa55-w0rd-in-the-clear-9137"
	wrongs := []string{"wrong-pa55-4242", "another-wrong-pa55-7171"}

	var pulls sync.Map
	var pushing atomic.Bool // the test's own push needs no credentials
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !pushing.Load() && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			u, p, ok := r.BasicAuth()
			pulls.Store(u+":"+p, true)
			if !ok || u != user || p != password {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.WriteHeader(http.StatusUnauthorized)
				// A careless registry echoes what it got.
				fmt.Fprintf(w, `{"errors":[{"code":"UNAUTHORIZED","message":"no %s:%s"}]}`, u, p)
				return
			}
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	dsn := storetest.SQLiteDSN(t)
	st := storetest.Open(t, dsn)
	dir := filepath.Join(t.TempDir(), "templates")
	keyFile := filepath.Join(t.TempDir(), "registry-credentials.key")
	var logs syncBuffer
	service := func() *templates.Service {
		key, err := templates.LoadOrCreateKey(keyFile)
		if err != nil {
			t.Fatal(err)
		}
		jc, err := jobs.New(ctx, st, jobs.Config{NodeID: "here"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(jc.Close)
		svc, err := templates.New(templates.Config{Store: st, Jobs: jc, NodeID: "here", Dir: dir, AllowPrivate: true, CredentialsKey: key,
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	f := &fixture{st: st, host: strings.TrimPrefix(srv.URL, "http://")}
	alice := newAccount(t, st)
	pushing.Store(true)
	ref := f.push(t, "private/app:1", v1.Config{Env: []string{"A=1"}}, map[string]string{"hello": "world"})
	pushing.Store(false)

	built := service()
	tpl, err := built.Build(ctx, alice, templates.BuildRequest{Name: "app:1", Image: ref, Registry: &oci.Credentials{Username: user, Password: password}})
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := st.GetTemplateCredentials(ctx, tpl.ID)
	if err != nil {
		t.Fatalf("the build's credentials are not kept for its job: %v", err)
	}
	if strings.Contains(sealed, password) || strings.Contains(sealed, user) {
		t.Fatalf("the credentials are stored in the clear: %q", sealed)
	}
	// Run by another Service over the same key file: a restart.
	restarted := service()
	if err := restarted.Run(ctx, tpl.ID); err != nil {
		t.Fatal(err)
	}
	got, _ := st.GetTemplate(ctx, tpl.ID)
	if got.Status != store.TemplateReady {
		t.Fatalf("build with the right password: %+v", got)
	}
	if _, ok := pulls.Load(user + ":" + password); !ok {
		t.Fatal("the registry was never sent the credentials")
	}
	if _, err := st.GetTemplateCredentials(ctx, tpl.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the credentials outlive the build: %v", err)
	}

	// A wrong password: a failed build saying the registry refused the
	// credentials.
	bad, err := restarted.Build(ctx, alice, templates.BuildRequest{Name: "app:2", Image: ref, Registry: &oci.Credentials{Username: user, Password: wrongs[0]}})
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.Run(ctx, bad.ID); err != nil {
		t.Fatal(err)
	}
	got, _ = st.GetTemplate(ctx, bad.ID)
	if got.Status != store.TemplateFailed || !strings.Contains(got.FailureReason, "the registry refused the credentials") {
		t.Fatalf("build with a wrong password: %+v", got)
	}
	if _, err := st.GetTemplateCredentials(ctx, bad.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the credentials outlive the failed build: %v", err)
	}

	// Deleted before its build ran: the credentials go with the template.
	gone, err := restarted.Build(ctx, alice, templates.BuildRequest{Name: "app:3", Image: ref, Registry: &oci.Credentials{Username: user, Password: wrongs[1]}})
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.Delete(ctx, alice, gone.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetTemplateCredentials(ctx, gone.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the credentials outlive the deleted template: %v", err)
	}

	// Sealed credentials that do not open (the key file replaced) fail the
	// build with a reason, not a panic or an anonymous pull.
	orphan, err := restarted.Build(ctx, alice, templates.BuildRequest{Name: "app:4", Image: ref, Registry: &oci.Credentials{Username: user, Password: password}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	if err := service().Run(ctx, orphan.ID); err != nil {
		t.Fatal(err)
	}
	got, _ = st.GetTemplate(ctx, orphan.ID)
	if got.Status != store.TemplateFailed || !strings.Contains(got.FailureReason, "cannot be read with this server's key") {
		t.Fatalf("build whose credentials do not open: %+v", got)
	}

	// The secrets, as given and as Basic auth sends them, are nowhere.
	secrets := []string{password, base64.StdEncoding.EncodeToString([]byte(user + ":" + password))}
	for _, w := range wrongs {
		secrets = append(secrets, w, base64.StdEncoding.EncodeToString([]byte(user+":"+w)))
	}
	var rows strings.Builder
	list, err := st.ListTemplates(ctx, alice.AccountID)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range list {
		fmt.Fprintf(&rows, "%+v\n", tp)
	}
	if err := st.Close(); err != nil { // checkpoints the WAL into the file
		t.Fatal(err)
	}
	var db []byte
	for _, p := range []string{dsn, dsn + "-wal", dsn + "-shm"} {
		b, err := os.ReadFile(p)
		if err == nil {
			db = append(db, b...)
		}
	}
	if len(db) == 0 {
		t.Fatal("no database file to look into")
	}
	for _, s := range secrets {
		for what, text := range map[string]string{"database file": string(db), "rows and build logs": rows.String(), "server log": logs.String()} {
			if strings.Contains(text, s) {
				t.Errorf("the %s holds the secret %q", what, s)
			}
		}
	}
	if !strings.Contains(rows.String(), "with registry credentials (username=alice password=[redacted])") {
		t.Errorf("the build log does not say it used credentials:\n%s", rows.String())
	}
}

func newAccount(t *testing.T, st *store.Store) (p auth.Principal) {
	t.Helper()
	a := store.Account{Name: "u", Kind: store.AccountPersonal}
	if err := st.CreateAccount(t.Context(), &a); err != nil {
		t.Fatal(err)
	}
	p.AccountID, p.Kind = a.ID, a.Kind
	return p
}

func TestBuildRefusesBadCredentials(t *testing.T) {
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	jc, err := jobs.New(t.Context(), st, jobs.Config{NodeID: "here"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(jc.Close)
	key, err := templates.LoadOrCreateKey(filepath.Join(t.TempDir(), "k"))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := templates.New(templates.Config{Store: st, Jobs: jc, NodeID: "here", Dir: filepath.Join(t.TempDir(), "templates"), CredentialsKey: key})
	if err != nil {
		t.Fatal(err)
	}
	alice := newAccount(t, st)
	for _, c := range []struct {
		creds oci.Credentials
		words string
	}{
		{oci.Credentials{}, "registry: give a username and password, or a token"},
		{oci.Credentials{Password: "p"}, "registry: username: required with a password"},
		{oci.Credentials{Username: "u"}, "registry: password: required with a username"},
		{oci.Credentials{Username: "u", Password: "p", RegistryToken: "t"}, "not both"},
		{oci.Credentials{IdentityToken: "t"}, "identity token is not taken"},
		{oci.Credentials{Username: "a:b", Password: "p"}, "username: contains ':'"},
		{oci.Credentials{Username: "u", Password: strings.Repeat("p", 17<<10)}, "password: longer than"},
		{oci.Credentials{RegistryToken: "a b"}, "token: contains spaces"},
	} {
		_, err := svc.Build(t.Context(), alice, templates.BuildRequest{Name: "a", Image: "registry.example/a", Registry: &c.creds})
		wantClass(t, c.words, err, errdefs.ErrInvalid, c.words)
	}
	if list, _ := svc.List(t.Context(), alice); len(list) != 0 {
		t.Fatalf("refused builds left %d rows", len(list))
	}
}
