package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
)

// privateRegistry is an in-process registry (go-containerregistry's) on
// loopback that demands credentials for every read: Basic auth, or, with
// token, Docker's token flow (a 401 with a Bearer challenge naming its
// token service, /token, which takes the Basic credentials and answers a
// token the registry then takes). The test's own pushes pass with a
// header. hold, while set, keeps authenticated manifest reads of
// repositories named "slow" waiting until it is cleared.
type privateRegistry struct {
	host           string
	user, password string
	token          bool
	mu             sync.Mutex
	issued         map[string]bool
	hold           chan struct{}
	held           atomic.Int64 // reads held so far
}

func newPrivateRegistry(t *testing.T, user, password string, token bool) *privateRegistry {
	t.Helper()
	r := &privateRegistry{user: user, password: password, token: token, issued: map[string]bool{}}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("X-Test-Push") != "" {
			inner.ServeHTTP(w, req)
			return
		}
		if !r.authorized(w, req) {
			return
		}
		r.mu.Lock()
		hold := r.hold
		r.mu.Unlock()
		if hold != nil && strings.Contains(req.URL.Path, "/slow/manifests/") {
			r.held.Add(1)
			select {
			case <-hold:
			case <-req.Context().Done():
				return
			}
		}
		inner.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// authorized answers the request's authentication, or says it may go on.
func (r *privateRegistry) authorized(w http.ResponseWriter, req *http.Request) bool {
	if !r.token {
		if u, p, ok := req.BasicAuth(); ok && u == r.user && p == r.password {
			return true
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="private"`)
		w.WriteHeader(http.StatusUnauthorized)
		return false
	}
	if req.URL.Path == "/token" {
		u, p, ok := req.BasicAuth()
		if !ok || u != r.user || p != r.password {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return false
		}
		r.mu.Lock()
		tok := fmt.Sprintf("tok-%d", len(r.issued))
		r.issued[tok] = true
		r.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]string{"token": tok})
		return false
	}
	tok, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	r.mu.Lock()
	good := ok && r.issued[tok]
	r.mu.Unlock()
	if !good {
		w.Header().Set("WWW-Authenticate", `Bearer realm="http://`+req.Host+`/token",service="private"`)
		w.WriteHeader(http.StatusUnauthorized)
	}
	return good
}

type testPush struct{ http.RoundTripper }

func (p testPush) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("X-Test-Push", "1")
	return p.RoundTripper.RoundTrip(req)
}

// push writes the test image as repo:tag past the registry's auth.
func (r *privateRegistry) push(t *testing.T, repoTag string) string {
	t.Helper()
	ref, err := name.ParseReference(r.host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	img := templateImage(t, v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "FROM_PRIVATE=yes"}, WorkingDir: "/opt/app"})
	if err := remote.Write(ref, img, remote.WithTransport(testPush{http.DefaultTransport})); err != nil {
		t.Fatal(err)
	}
	return ref.String()
}

// TestTemplateCreds: templates built from registries that
// demand credentials — Basic auth and a token service — through the
// REST API's registry object and E2B's fromImageRegistry; a sandbox from
// one runs the image. A wrong password fails the build saying the
// registry refused the credentials. A build cut by a stop of the server
// still has its credentials when the server is back. The passwords are
// nowhere afterwards: not in the answers, the build logs, the server's
// log, or any file of its data directory (the database included), and
// the sealed credentials are gone from the database.
func TestTemplateCreds(t *testing.T) {
	securitytest.Attack(t, "images", "an image in a private registry, built with the account's registry credentials",
		"the credentials reach the registry (Basic, or exchanged for a token) and nothing else: never an answer, a log, or a file in the clear, and gone once the build ends")
	const user = "builder"
	basicPW, tokenPW, wrongPW := "basic-pw-6c1f0a", "token-pw-93b2de", "wrong-pw-d07a51"
	basicReg := newPrivateRegistry(t, user, basicPW, false)
	tokenReg := newPrivateRegistry(t, user, tokenPW, true)
	basicRef := basicReg.push(t, "apps/hello:v1")
	tokenRef := tokenReg.push(t, "apps/hello:v1")
	slowRef := tokenReg.push(t, "apps/slow:v1")

	dataDir := t.TempDir()
	dsn := filepath.Join(t.TempDir(), "creds.db")
	// Debug logging: no level of the server's log may show a secret.
	flags := []string{"--templates-allow-private-registries", "--network-pool", "10.244.0.0/16", "--log-level", "debug"}
	s := startServerIn(t, dataDir, dsn, flags...)
	alice := s.createAccount("alice", false)
	ak := s.createKey(alice.ID)

	answers := &strings.Builder{}
	post := func(body map[string]any) string {
		t.Helper()
		r := s.as(ak, "POST", "/api/templates", body)
		answers.Write(r.Raw)
		if r.Status != 202 {
			t.Fatalf("build %v: %d %s", body["name"], r.Status, r.Raw)
		}
		return r.Body["template"].(map[string]any)["id"].(string)
	}
	wait := func(s *server, id string) map[string]any {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			r := s.as(ak, "GET", "/api/templates/"+id, nil)
			answers.Write(r.Raw)
			if r.Status != 200 {
				t.Fatalf("get %s: %d %s", id, r.Status, r.Raw)
			}
			tpl := r.Body["template"].(map[string]any)
			if tpl["status"] != "building" {
				return tpl
			}
			if time.Now().After(deadline) {
				t.Fatalf("still building: %s", r.Raw)
			}
		}
	}

	// Anonymous: the registry wants credentials.
	tpl := wait(s, post(map[string]any{"name": "anon:v1", "image": basicRef}))
	if tpl["status"] != "failed" || !strings.Contains(fmt.Sprint(tpl["failureReason"]), "it needs credentials") {
		t.Fatalf("anonymous build: %v", tpl)
	}
	// Basic auth, then a sandbox from the template runs the image.
	tpl = wait(s, post(map[string]any{"name": "basic:v1", "image": basicRef, "registry": map[string]string{"username": user, "password": basicPW}}))
	if tpl["status"] != "ready" || !strings.Contains(fmt.Sprint(tpl["log"]), "with registry credentials (username=builder password=[redacted])") {
		t.Fatalf("basic build: %v", tpl)
	}
	sb := s.createSandbox(ak, map[string]any{"template": "basic:v1"})
	r := s.as(ak, "POST", "/api/sandboxes/"+sb["sandboxId"].(string)+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "echo $FROM_PRIVATE; cat hello.txt"}})
	if r.Status != 200 || r.Body["stdout"] != "yes\nhello from the image\n" {
		t.Fatalf("exec in a sandbox of the private image: %d %s", r.Status, r.Raw)
	}
	s.as(ak, "POST", "/api/sandboxes/"+sb["sandboxId"].(string)+"/stop", nil)

	// A token registry: the same credentials, exchanged for a token.
	tpl = wait(s, post(map[string]any{"name": "token:v1", "image": tokenRef, "registry": map[string]string{"username": user, "password": tokenPW}}))
	if tpl["status"] != "ready" {
		t.Fatalf("token build: %v", tpl)
	}
	// The CLI: the password on stdin, or in the environment.
	for _, c := range []struct {
		name, ref string
		stdin     io.Reader
		env       []string
		flags     []string
	}{
		{"cli:v1", tokenRef, strings.NewReader(tokenPW + "\n"), nil, []string{"--registry-username", user, "--registry-password-stdin"}},
		{"cli:v2", basicRef, nil, []string{"SANDBOXD_REGISTRY_PASSWORD=" + basicPW}, []string{"--registry-username", user}},
	} {
		args := append([]string{"template", "--url", s.base, "--key", ak.Key, "build", c.name, "--image", c.ref, "--wait", "--json"}, c.flags...)
		res := runCLI(t, c.stdin, c.env, args...)
		answers.WriteString(res.stdout + res.stderr)
		if res.code != 0 || !strings.Contains(res.stdout, `"status": "ready"`) && !strings.Contains(res.stdout, `"status":"ready"`) {
			t.Fatalf("template build %s: %d %s %s", c.name, res.code, res.stdout, res.stderr)
		}
	}

	// A wrong password, at either: failed, saying so.
	for i, ref := range []string{basicRef, tokenRef} {
		tpl = wait(s, post(map[string]any{"name": fmt.Sprintf("wrong:v%d", i), "image": ref, "registry": map[string]string{"username": user, "password": wrongPW}}))
		if tpl["status"] != "failed" || !strings.Contains(fmt.Sprint(tpl["failureReason"]), "the registry refused the credentials") {
			t.Fatalf("build with a wrong password from %s: %v", ref, tpl)
		}
	}

	// E2B's Template API: the start body's fromImageRegistry.
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, s.base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", ak.Key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answers.Write(b)
		return resp.StatusCode, string(b)
	}
	if code, body := do("POST", "/v3/templates", `{"name":"e2b-private:v1"}`); code != 202 {
		t.Fatalf("POST /v3/templates: %d %s", code, body)
	}
	if code, body := do("POST", "/v2/templates/e2b-private/builds/v1", fmt.Sprintf(`{"fromImage":%q,"fromImageRegistry":{"type":"aws","awsAccessKeyId":"AKIA","awsSecretAccessKey":"aws-secret-x","awsRegion":"eu-west-1"}}`, tokenRef)); code != 400 ||
		!strings.Contains(body, "fromImageRegistry.type aws: not supported") {
		t.Fatalf("aws registry: %d %s", code, body)
	}
	start := fmt.Sprintf(`{"fromImage":%q,"fromImageRegistry":{"type":"registry","username":%q,"password":%q},"steps":[]}`, tokenRef, user, tokenPW)
	if code, body := do("POST", "/v2/templates/e2b-private/builds/v1", start); code != 202 {
		t.Fatalf("start: %d %s", code, body)
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		code, body := do("GET", "/templates/e2b-private/builds/v1/status", "")
		if code != 200 || strings.Contains(body, `"status":"error"`) {
			t.Fatalf("status: %d %s", code, body)
		}
		if strings.Contains(body, `"status":"ready"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still building: %s", body)
		}
	}

	// A build cut by a crash: its registry read is held until the server
	// is killed; the restarted server resumes it with its credentials.
	tokenReg.mu.Lock()
	tokenReg.hold = make(chan struct{})
	tokenReg.mu.Unlock()
	slowID := post(map[string]any{"name": "slow:v1", "image": slowRef, "registry": map[string]string{"username": user, "password": tokenPW}})
	for deadline := time.Now().Add(time.Minute); tokenReg.held.Load() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the build never reached the registry")
		}
	}
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = s.cmd.Wait()
	logs := s.logs.String()
	tokenReg.mu.Lock()
	close(tokenReg.hold)
	tokenReg.hold = nil
	tokenReg.mu.Unlock()
	s = startServerIn(t, dataDir, dsn, flags...)
	tpl = wait(s, slowID)
	if tpl["status"] != "ready" || strings.Count(fmt.Sprint(tpl["log"]), "resolving "+slowRef+" with registry credentials") != 2 {
		t.Fatalf("resumed build: %v", tpl)
	}
	s.stop()
	logs += s.logs.String()

	// Nothing of the credentials is left: no sealed row, and no password
	// in the clear anywhere.
	st, err := store.Open(context.Background(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	list, err := st.ListTemplates(context.Background(), alice.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 9 {
		t.Errorf("templates: %d", len(list))
	}
	for _, tp := range list {
		if _, err := st.GetTemplateCredentials(context.Background(), tp.ID); err == nil {
			t.Errorf("template %s:%s still has sealed credentials", tp.Name, tp.Tag)
		}
	}
	st.Close()
	secrets := []string{}
	for _, pw := range []string{basicPW, tokenPW, wrongPW, "aws-secret-x"} {
		secrets = append(secrets, pw, base64.StdEncoding.EncodeToString([]byte(user+":"+pw)))
	}
	var files []string
	err = filepath.WalkDir(dataDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || strings.Contains(path, string(filepath.Separator)+"templates"+string(filepath.Separator)) {
			return err // the unpacked images are the registry's files
		}
		files = append(files, path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, dsn, dsn+"-wal", dsn+"-shm")
	for _, sec := range secrets {
		for what, text := range map[string]string{"answers": answers.String(), "server log": logs} {
			if strings.Contains(text, sec) {
				t.Errorf("the %s show the secret %q", what, sec)
			}
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err == nil && strings.Contains(string(b), sec) {
				t.Errorf("%s holds the secret %q", f, sec)
			}
		}
	}
}
