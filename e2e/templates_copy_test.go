package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestTemplateCopy: COPY of uploaded build files, end to end on gVisor. A
// Dockerfile with RUN and COPY (--chown, --chmod, a directory, a file into
// WORKDIR, the whole context) is built over REST from a context archive
// uploaded with PUT /api/templates/files/{hash}, and with the CLI
// (`template build --dockerfile --context DIR`, which packs DIR without
// what its .dockerignore names); sandboxes from both see the files with
// their owners, modes and links. Hostile archives are refused at upload,
// and a build naming files never uploaded is 400. E2B's upload flow, with
// the bodies the JS SDK sends: GET /templates/{id}/files/{hash} answers
// 201 with a signed url, a PUT there without a key stores the archive
// (another hash, or a tampered signature, is 403), and a build's COPY step
// (as USER nobody: its primary group) copies from it.
func TestTemplateCopy(t *testing.T) {
	ref := pushImage(t, testRegistry(t), "apps/copybase:v1", templateImage(t, v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}}))
	s := startServer(t, filepath.Join(t.TempDir(), "templates-copy.db"), "--templates-allow-private-registries", "--network-pool", "10.240.0.0/16")
	alice := s.createAccount("alice", false)
	ak := s.createKey(alice.ID)
	bob := s.createAccount("bob", false)
	bk := s.createKey(bob.ID)

	raw := func(method, path string, headers map[string]string, body []byte) (int, string) {
		t.Helper()
		u := path
		if !strings.HasPrefix(path, "http") {
			u = s.base + path
		}
		req, err := http.NewRequest(method, u, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for h, v := range headers {
			req.Header.Set(h, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	wait := func(id string) map[string]any {
		t.Helper()
		return s.waitTemplate(ak, id)
	}
	execIn := func(tplName, script string) string {
		t.Helper()
		sb := s.createSandbox(ak, map[string]any{"template": tplName})
		sid := sb["sandboxId"].(string)
		defer s.as(ak, "POST", "/api/sandboxes/"+sid+"/stop", nil)
		r := s.as(ak, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "sh", "args": []string{"-c", script}})
		if r.Status != 200 {
			t.Fatalf("exec in a sandbox of %s: %d %s", tplName, r.Status, r.Raw)
		}
		return fmt.Sprint(r.Body["stdout"]) + fmt.Sprint(r.Body["stderr"])
	}

	// The context, as a directory (for the CLI) and as the archive a
	// client uploads (for REST).
	ctxDir := t.TempDir()
	files := map[string]string{
		"app/main.py":      "print('hi')\n",
		"app/sub/data.txt": "data\n",
		"run.sh":           "#!/bin/sh\necho run\n",
		"notes.txt":        "notes\n",
		"secret.txt":       "never copied\n",
		".dockerignore":    "secret.txt\n",
	}
	for n, c := range files {
		if err := os.MkdirAll(filepath.Join(ctxDir, filepath.Dir(n)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ctxDir, n), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(ctxDir, "app/sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("main.py", filepath.Join(ctxDir, "app/link")); err != nil {
		t.Fatal(err)
	}
	archive := gzTar(t, []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "app/", Mode: 0o755},
		{Typeflag: tar.TypeReg, Name: "app/main.py", Mode: 0o644},
		{Typeflag: tar.TypeSymlink, Name: "app/link", Linkname: "main.py"},
		{Typeflag: tar.TypeDir, Name: "app/sub/", Mode: 0o700},
		{Typeflag: tar.TypeReg, Name: "app/sub/data.txt", Mode: 0o644},
		{Typeflag: tar.TypeReg, Name: "run.sh", Mode: 0o644},
		{Typeflag: tar.TypeReg, Name: "notes.txt", Mode: 0o644},
	}, files)
	hash := sha256Hex(archive)
	withKey := map[string]string{"x-api-key": ak.Key}

	// Uploads: absent, then present (for alice only); hostile ones refused.
	if r := s.as(ak, "GET", "/api/templates/files/"+hash, nil); r.Status != 200 || r.Body["present"] != false {
		t.Fatalf("presence before the upload: %d %s", r.Status, r.Raw)
	}
	if code, body := raw("PUT", "/api/templates/files/"+hash, withKey, archive); code != 200 || !strings.Contains(body, `"present":true`) {
		t.Fatalf("upload: %d %s", code, body)
	}
	if r := s.as(ak, "GET", "/api/templates/files/"+hash, nil); r.Status != 200 || r.Body["present"] != true {
		t.Fatalf("presence after the upload: %d %s", r.Status, r.Raw)
	}
	if r := s.as(bk, "GET", "/api/templates/files/"+hash, nil); r.Status != 200 || r.Body["present"] != false {
		t.Fatalf("another account's presence: %d %s", r.Status, r.Raw)
	}
	for _, c := range []struct {
		name string
		hdr  *tar.Header
		want string
	}{
		{"traversal", &tar.Header{Typeflag: tar.TypeReg, Name: "../../etc/evil", Mode: 0o644}, "path traversal"},
		{"absolute link", &tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "/etc/shadow"}, "absolute path"},
		{"device", &tar.Header{Typeflag: tar.TypeChar, Name: "dev", Devmajor: 1, Devminor: 3}, "device node"},
	} {
		bad := gzTar(t, []*tar.Header{c.hdr}, map[string]string{})
		if code, body := raw("PUT", "/api/templates/files/"+sha256Hex(bad), withKey, bad); code != 400 || !strings.Contains(body, c.want) {
			t.Fatalf("hostile upload (%s): %d %s", c.name, code, body)
		}
	}
	if code, body := raw("PUT", "/api/templates/files/NOTAHASH", withKey, archive); code != 400 || !strings.Contains(body, "64 lower-case hex") {
		t.Fatalf("upload under a bad name: %d %s", code, body)
	}

	dockerfile := "FROM " + ref.String() + "\n" +
		"RUN echo 'app:x:1000:1000::/home/app:/bin/sh' >> /etc/passwd && echo 'app:x:1000:' >> /etc/group\n" +
		"WORKDIR /srv\n" +
		"COPY --chown=app app/ ./app/\n" +
		"COPY --chmod=0750 run.sh /usr/local/bin/\n" +
		"COPY notes.txt .\n" +
		"COPY . /ctx/\n"
	check := func(tplName string) {
		t.Helper()
		out := execIn(tplName, "cd /srv && stat -c '%U:%G %a %n' app app/main.py app/sub app/sub/data.txt /usr/local/bin/run.sh notes.txt; "+
			"readlink app/link; cat app/link app/sub/data.txt; /usr/local/bin/run.sh; ls /ctx; test -e /ctx/secret.txt && echo LEAKED; true")
		want := "app:app 755 app\napp:app 644 app/main.py\napp:app 700 app/sub\napp:app 644 app/sub/data.txt\n" +
			"root:root 750 /usr/local/bin/run.sh\nroot:root 644 notes.txt\nmain.py\nprint('hi')\ndata\nrun\napp\nnotes.txt\nrun.sh\n"
		if out != want {
			t.Fatalf("the copied files in a sandbox of %s:\n%s\nwant:\n%s", tplName, out, want)
		}
	}

	// REST: a context never uploaded is refused; the uploaded one builds.
	if r := s.as(ak, "POST", "/api/templates", map[string]any{"name": "copy:none", "dockerfile": dockerfile, "context": strings.Repeat("0", 64)}); r.Status != 400 || !strings.Contains(string(r.Raw), "not uploaded") {
		t.Fatalf("a context never uploaded: %d %s", r.Status, r.Raw)
	}
	if r := s.as(ak, "POST", "/api/templates", map[string]any{"name": "copy:noctx", "dockerfile": dockerfile}); r.Status != 400 || !strings.Contains(string(r.Raw), "needs a build context") {
		t.Fatalf("COPY without a context: %d %s", r.Status, r.Raw)
	}
	if r := s.as(ak, "POST", "/api/templates", map[string]any{"name": "copy:url", "dockerfile": "FROM " + ref.String() + "\nADD https://registry.example/x /x\n", "context": hash}); r.Status != 400 || !strings.Contains(string(r.Raw), "not URLs") {
		t.Fatalf("ADD of a URL: %d %s", r.Status, r.Raw)
	}
	if r := s.as(ak, "POST", "/api/templates", map[string]any{"name": "copy:from", "dockerfile": "FROM " + ref.String() + "\nCOPY --from=build /a /a\n", "context": hash}); r.Status != 400 || !strings.Contains(string(r.Raw), "--from") {
		t.Fatalf("COPY --from: %d %s", r.Status, r.Raw)
	}
	r := s.as(ak, "POST", "/api/templates", map[string]any{"name": "copy:rest", "dockerfile": dockerfile, "context": hash})
	if r.Status != 202 {
		t.Fatalf("build with a context: %d %s", r.Status, r.Raw)
	}
	tpl := wait(r.Body["template"].(map[string]any)["id"].(string))
	if tpl["status"] != "ready" || !strings.Contains(fmt.Sprint(tpl["log"]), "step 3/6: COPY app ./app/") {
		t.Fatalf("build with COPY: %v", tpl)
	}
	check("copy:rest")

	// The CLI packs the directory (without secret.txt), uploads it and
	// builds; its archive is another than the test's, so another hash.
	dfPath := filepath.Join(t.TempDir(), "Dockerfile")
	if err := os.WriteFile(dfPath, []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) cliResult {
		t.Helper()
		return runCLI(t, nil, nil, append([]string{args[0], "--url", s.base, "--key", ak.Key}, args[1:]...)...)
	}
	res := cli("template", "build", "copy:cli", "--dockerfile", dfPath, "--context", ctxDir, "--wait")
	if res.code != 0 || !strings.Contains(res.stderr, "sandboxd: context ") || !strings.Contains(res.stderr, "sandboxd: uploaded ") || !strings.Contains(res.stdout, "ready") {
		t.Fatalf("template build --context: %d %s %s", res.code, res.stdout, res.stderr)
	}
	check("copy:cli")
	// Again: the same directory packs to the same archive, already there.
	res = cli("template", "build", "copy:cli2", "--dockerfile", dfPath, "--context", ctxDir, "--wait")
	if res.code != 0 || !strings.Contains(res.stderr, "context already uploaded") || !strings.Contains(res.stderr, "cached") {
		t.Fatalf("template build --context again: %d %s %s", res.code, res.stdout, res.stderr)
	}

	// E2B: the Template API's upload link and a COPY step that reads it.
	e2b := func(k key, method, path string, body any) (int, map[string]any, string) {
		t.Helper()
		b, _ := json.Marshal(body)
		code, text := raw(method, path, map[string]string{"X-API-Key": k.Key, "Content-Type": "application/json"}, b)
		var out map[string]any
		_ = json.Unmarshal([]byte(text), &out)
		return code, out, text
	}
	if code, _, text := e2b(ak, "POST", "/v3/templates", map[string]any{"name": "e2bcopy:v1", "cpuCount": 2, "memoryMB": 1024}); code != 202 {
		t.Fatalf("request a build: %d %s", code, text)
	}
	sdkArchive := gzTar(t, []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "app/", Mode: 0o755},
		{Typeflag: tar.TypeReg, Name: "app/main.py", Mode: 0o644},
	}, files)
	filesHash := sha256Hex([]byte("COPY app /home/app/ (the SDK's own hash of the step)"))
	code, link, text := e2b(ak, "GET", "/templates/e2bcopy/files/"+filesHash, nil)
	if code != 201 || link["present"] != false || !strings.HasPrefix(fmt.Sprint(link["url"]), s.base+"/templates/e2bcopy/files/"+filesHash+"?") {
		t.Fatalf("upload link: %d %s", code, text)
	}
	upload := fmt.Sprint(link["url"])
	// Another hash, or another signature, with the same link: refused.
	other := strings.Replace(upload, filesHash, hash, 1)
	if code, body := raw("PUT", other, nil, sdkArchive); code != 403 {
		t.Fatalf("the link for another hash: %d %s", code, body)
	}
	u, _ := url.Parse(upload)
	q := u.Query()
	q.Set("account", bob.ID)
	u.RawQuery = q.Encode()
	if code, body := raw("PUT", u.String(), nil, sdkArchive); code != 403 {
		t.Fatalf("the link for another account: %d %s", code, body)
	}
	if code, body := raw("PUT", upload, nil, sdkArchive); code != 200 {
		t.Fatalf("the SDK's PUT: %d %s", code, body)
	}
	if code, link, text := e2b(ak, "GET", "/templates/e2bcopy/files/"+filesHash, nil); code != 201 || link["present"] != true || link["url"] == nil {
		t.Fatalf("upload link once uploaded: %d %s", code, text)
	}
	if code, link, text := e2b(bk, "GET", "/templates/e2bcopy/files/"+filesHash, nil); code != 201 || link["present"] != false {
		t.Fatalf("another account's upload link: %d %s", code, text)
	}
	start := map[string]any{
		"fromImage": ref.String(), "force": false,
		"steps": []map[string]any{
			{"type": "USER", "args": []string{"nobody"}, "force": false},
			// nobody's home, /nonexistent, is no directory to run in.
			{"type": "WORKDIR", "args": []string{"/home"}, "force": false},
			{"type": "COPY", "args": []string{"app", "/home/app/", "", "0750"}, "force": false, "filesHash": filesHash, "forceUpload": false, "resolveSymlinks": false, "gzip": true},
		},
	}
	if code, _, text := e2b(ak, "POST", "/v2/templates/e2bcopy/builds/v1", start); code != 202 {
		t.Fatalf("start the build: %d %s", code, text)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		code, st, text := e2b(ak, "GET", "/templates/e2bcopy/builds/v1/status?logsOffset=0", nil)
		if code != 200 {
			t.Fatalf("build status: %d %s", code, text)
		}
		if st["status"] == "ready" {
			break
		}
		if st["status"] == "error" || time.Now().After(deadline) {
			t.Fatalf("E2B build with COPY: %s", text)
		}
		time.Sleep(200 * time.Millisecond)
	}
	out := execIn("e2bcopy:v1", "stat -c '%U:%G %a %n' /home/app /home/app/main.py")
	if out != "nobody:nogroup 750 /home/app\nnobody:nogroup 750 /home/app/main.py\n" {
		t.Fatalf("the E2B COPY's files: %q", out)
	}
}

// gzTar is a gzipped tar of hdrs, a regular file's content from files by
// its name (its size set from it).
func gzTar(t *testing.T, hdrs []*tar.Header, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, h := range hdrs {
		body := files[h.Name]
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
