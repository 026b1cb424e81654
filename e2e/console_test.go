package e2e

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromium finds Debian's chromium (scripts/install-test-tools.sh installs it);
// without it the console test skips, or fails under
// SANDBOXD_REQUIRE_RUNTIME=1.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("SANDBOXD_REQUIRE_RUNTIME") == "1" {
		t.Fatal("chromium is not installed (scripts/install-test-tools.sh installs it; SANDBOXD_REQUIRE_RUNTIME=1)")
	}
	t.Skip("chromium is not installed (scripts/install-test-tools.sh installs it)")
	return ""
}

// artifactsDir is where a test's screenshots go: $SANDBOXD_ARTIFACTS/NAME
// (make test sets bin/artifacts), else e2e/.artifacts/NAME beside the
// tests; both outlive the test, unlike its temp dir.
func artifactsDir(t *testing.T, name string) string {
	t.Helper()
	root := os.Getenv("SANDBOXD_ARTIFACTS")
	if root == "" {
		root = ".artifacts"
	}
	dir, err := filepath.Abs(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	// Only this run's screenshots: none left from an earlier one.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots go to %s", dir)
	return dir
}

// uploadFile commits one file to the account's repository through the
// API's multipart upload.
func (s *server) uploadFile(k key, dir, name string, content []byte) {
	s.t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	if dir != "" {
		_ = mw.WriteField("path", dir)
	}
	fw, _ := mw.CreateFormFile("file", name)
	_, _ = fw.Write(content)
	mw.Close()
	req, _ := http.NewRequest("POST", s.base+"/api/sandboxes/files", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("x-api-key", k.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		s.t.Fatalf("upload %s: %d %s", name, resp.StatusCode, raw)
	}
}

// gradientPNG is a size×size PNG of colours.
func gradientPNG(t *testing.T, size int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, size, size))
	for y := range size {
		for x := range size {
			img.Set(x, y, color.RGBA{R: uint8(255 * x / size), G: uint8(255 * y / size), B: 200, A: 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// minimalPDF is a one-page PDF that shows text, with a correct xref table.
func minimalPDF(text string) []byte {
	content := fmt.Sprintf("BT /F1 24 Tf 72 720 Td (%s) Tj ET", text)
	objects := []string{
		"<< /Type /Catalog /Pages 2 0 R >>",
		"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
		"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
		fmt.Sprintf("<< /Length %d >>\nstream\n%s\nendstream", len(content), content),
		"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
	}
	var b bytes.Buffer
	b.WriteString("%PDF-1.4\n")
	offsets := make([]int, len(objects))
	for i, o := range objects {
		offsets[i] = b.Len()
		fmt.Fprintf(&b, "%d 0 obj\n%s\nendobj\n", i+1, o)
	}
	xref := b.Len()
	fmt.Fprintf(&b, "xref\n0 %d\n0000000000 65535 f \n", len(objects)+1)
	for _, off := range offsets {
		fmt.Fprintf(&b, "%010d 00000 n \n", off)
	}
	fmt.Fprintf(&b, "trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n", len(objects)+1, xref)
	return b.Bytes()
}

// consoleBrowser is a headless Chromium on the console, and the steps the
// console's tests take in it. Every step fails the test with a screenshot
// (failed.png) when it does not happen; the page must never hit its
// Content-Security-Policy nor throw, which is checked when the test ends.
type consoleBrowser struct {
	t     *testing.T
	ctx   context.Context
	shots string
}

// newConsoleBrowser starts Chromium with a desktop window (1280×800);
// screenshots go to the artifacts' dir shots.
func newConsoleBrowser(t *testing.T, shots string) *consoleBrowser {
	t.Helper()
	chrome := chromium(t)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(chrome),
			chromedp.NoSandbox, // root in CI; the browser only visits this test's loopback server
			chromedp.WindowSize(1280, 800),
			chromedp.UserDataDir(t.TempDir()),
			chromedp.Flag("disable-sync", true),
			chromedp.Flag("disable-component-update", true),
		)...)
	ctx, cancel := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancelAlloc)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	var (
		mu       sync.Mutex
		messages []chromedp.ConsoleMessage
	)
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			mu.Lock()
			messages = append(messages, m)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range messages {
			t.Logf("browser console: %s", m)
			if m.IsException() || strings.Contains(m.Text, "Content Security Policy") || strings.Contains(m.Text, "Refused to") {
				t.Errorf("the page broke a rule or threw: %s", m)
			}
		}
	})
	return &consoleBrowser{t: t, ctx: ctx, shots: shots}
}

func (b *consoleBrowser) shot(name string) { shot(b.t, b.ctx, b.shots, name) }

func (b *consoleBrowser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	stepCtx, cancel := context.WithTimeout(b.ctx, 2*time.Minute)
	defer cancel()
	if err := chromedp.Do(stepCtx, steps...); err != nil {
		b.shot("failed")
		b.t.Fatalf("%s: %v", what, err)
	}
}

func (b *consoleBrowser) eval(expr string) any {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[any](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// text is the textContent of the element a selector finds ("" for none).
func (b *consoleBrowser) text(sel string) string {
	b.t.Helper()
	s, _ := b.eval(fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? e.textContent : ''; })()`, sel)).(string)
	return s
}

// waitFor waits until a JavaScript condition holds in the page.
func (b *consoleBrowser) waitFor(what, expr string, timeout time.Duration) {
	b.t.Helper()
	b.do(what, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(timeout), chromedp.WithPollingInterval(100*time.Millisecond)))
}

// goTo changes the view as the console's links do (a new hash, no page
// load).
func (b *consoleBrowser) goTo(hash string) {
	b.t.Helper()
	b.eval(fmt.Sprintf(`location.hash = %q`, hash))
}

// click clicks the element a selector finds now, in one step in the
// page: the console re-renders its lists as they refresh, which can
// replace a node between a query and a click.
func (b *consoleBrowser) click(what, sel string) {
	b.t.Helper()
	if b.eval(fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (e) e.click(); return !!e; })()`, sel)) != true {
		b.shot("failed")
		b.t.Fatalf("%s: nothing matches %s", what, sel)
	}
}

// reachable is a JavaScript function of an element that says why a user
// could not use it ("" when they can): scrolled to, it must be visible,
// inside the window's width, enabled and not covered by another element.
const reachable = `(e) => {
	if (!e) return 'nothing matches';
	e.scrollIntoView({ block: 'center', inline: 'nearest' });
	const r = e.getBoundingClientRect();
	const width = document.documentElement.clientWidth;
	if (r.width === 0 || r.height === 0) return 'not shown';
	if (r.left < 0 || r.right > width + 0.5) return 'outside the window (' + Math.round(r.left) + '..' + Math.round(r.right) + ' of ' + width + ')';
	if (e.disabled) return 'disabled';
	// A link that wraps is several boxes: aim at its first.
	const box = e.getClientRects()[0] || r;
	const hit = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
	if (!hit || !(hit === e || e.contains(hit) || (e.labels && [...e.labels].some((l) => l.contains(hit))))) return 'covered by ' + (hit ? hit.tagName + '#' + hit.id + '.' + hit.className : 'nothing');
	return '';
}`

// press clicks what a selector finds once a user could (see reachable),
// waiting for it to be there and enabled.
func (b *consoleBrowser) press(what, sel string) {
	b.t.Helper()
	b.use(what, sel, "e.click()")
}

// fill sets a field (an input or a select) as typing or choosing would,
// once a user could reach it.
func (b *consoleBrowser) fill(what, sel, value string) {
	b.t.Helper()
	b.use(what, sel, fmt.Sprintf(`e.value = %q; e.dispatchEvent(new Event('input', { bubbles: true })); e.dispatchEvent(new Event('change', { bubbles: true }))`, value))
}

// use runs action (JavaScript on e, the element) once e is reachable.
func (b *consoleBrowser) use(what, sel, action string) {
	b.t.Helper()
	expr := fmt.Sprintf(`(() => { const e = document.querySelector(%q); if ((%s)(e) !== '') return false; %s; return true; })()`, sel, reachable, action)
	stepCtx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	if err := chromedp.Do(stepCtx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		why, _ := b.eval(fmt.Sprintf(`(%s)(document.querySelector(%q))`, reachable, sel)).(string)
		b.shot("failed")
		b.t.Fatalf("%s: %s cannot be used: %s (%v)", what, sel, why, err)
	}
}

// viewport sets the window's size: the desktop's 1280×800 or a phone's
// 390×844 (not emulating a mobile browser, which would zoom a page out to
// fit what overflows instead of showing that it does).
func (b *consoleBrowser) viewport(width, height int64) {
	b.t.Helper()
	b.do(fmt.Sprintf("a %d×%d window", width, height), chromedp.EmulateViewport(width, height))
	b.waitFor("the new width", fmt.Sprintf(`window.innerWidth === %d`, width), 10*time.Second)
}

// noOverflow fails when the page is wider than the window.
func (b *consoleBrowser) noOverflow(where string) {
	b.t.Helper()
	got := b.eval(`(() => { const d = document.documentElement;
		if (d.scrollWidth <= d.clientWidth && d.clientWidth <= innerWidth) return '';
		const wide = [...document.querySelectorAll('body *')].filter((e) => e.getBoundingClientRect().right > d.clientWidth + 0.5)
			.slice(0, 5).map((e) => e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right));
		return 'scrollWidth ' + d.scrollWidth + ' > ' + d.clientWidth + ' (innerWidth ' + innerWidth + '): ' + wide.join(', '); })()`)
	if got != "" {
		b.shot("overflow-" + strings.ReplaceAll(where, " ", "-"))
		b.t.Errorf("%s: the page overflows the window: %v", where, got)
	}
}

// signIn opens the console at base and signs in with key.
func (b *consoleBrowser) signIn(base, key string) {
	b.t.Helper()
	b.do("open the console", chromedp.Navigate(base+"/console"), chromedp.WaitVisible(chromedp.ID("key")))
	b.do("sign in", chromedp.SendKeys(chromedp.ID("key"), key), chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.ID("view-sandboxes")))
}

// keyNowhere fails when the key is in the URL, a cookie, localStorage or
// the title.
func (b *consoleBrowser) keyNowhere(where, key string) {
	b.t.Helper()
	leak := b.eval(fmt.Sprintf(`(() => { const k = %q;
		return [location.href, document.cookie, JSON.stringify(Object.assign({}, localStorage)), document.title].some((v) => v.includes(k)); })()`, key))
	if leak != false {
		b.t.Fatalf("%s: the key is in the URL, a cookie or localStorage", where)
	}
}

// TestConsole drives the web console (/console/) in headless Chromium
// against a real server: sign in with a key (a wrong one is refused),
// create a sandbox whose command prints for a few seconds and watch its
// run's log arrive live until the run completes, see the sandbox with its
// remaining time and extend it, open files of the repository (Python
// highlighted, a PNG shown), the snapshot history, a shell in the sandbox
// through the terminal, stop the sandbox, sign out. The page must never
// hit its Content-Security-Policy nor throw, and the key must never reach
// a URL, localStorage or a cookie. Screenshots of each view are saved.
// TestConsoleOperations does the rest of what the console does, at a
// desktop's and a phone's width.
func TestConsole(t *testing.T) {
	chromium(t)
	shots := artifactsDir(t, "console")
	adminKey := strings.Repeat("0123456789abcdef", 4)
	adminKeyFile := filepath.Join(t.TempDir(), "admin.key")
	if err := os.WriteFile(adminKeyFile, []byte(adminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "", "--admin-key-file", adminKeyFile)
	a := s.createAccount("console", false)
	k := s.createKey(a.ID)
	// The repository's files, through the API: the test image has no git.
	s.uploadFile(k, "", "hello.py", []byte("# a greeting\ndef greet(name):\n    return \"hello, \" + name  # <b>not markup</b>\n\nprint(greet(\"console\"), 42)\n"))
	s.uploadFile(k, "img", "logo.png", gradientPNG(t, 96))
	s.uploadFile(k, "", "report.pdf", minimalPDF("Hello from sandboxd"))

	b := newConsoleBrowser(t, shots)
	eval, waitFor, goTo, click, do := b.eval, b.waitFor, b.goTo, b.click, b.do

	// Sign in: a wrong key is refused; the right one shows the sandboxes.
	do("open the console", chromedp.Navigate(s.base+"/console"), chromedp.WaitVisible(chromedp.ID("key")))
	b.shot("signin")
	do("try a wrong key", chromedp.SendKeys(chromedp.ID("key"), "sbx_wrong"), chromedp.Click(chromedp.ID("signin")))
	waitFor("the refusal", `document.getElementById('signin-error').textContent.includes('refused')`, 30*time.Second)
	eval(`document.getElementById('key').value = ''`)
	do("sign in", chromedp.SendKeys(chromedp.ID("key"), k.Key), chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.ID("view-sandboxes")))
	if got := eval(`sessionStorage.getItem('sandboxd.key')`); got != k.Key {
		t.Fatalf("sessionStorage holds %v", got)
	}
	b.keyNowhere("after sign-in", k.Key)

	// Create a sandbox with a command: the console follows its run's log,
	// which shows output while the run still executes, then its end.
	script := `echo console-start; i=0; while [ $i -lt 5 ]; do echo tick-$i; i=$((i+1)); sleep 1; done; echo console-done >&2`
	do("create a sandbox", chromedp.SendKeys(chromedp.ID("new-command"), script), chromedp.Click(chromedp.ID("create")))
	waitFor("the run view", `location.hash.startsWith('#runs/run_')`, 3*time.Minute)
	runID := strings.TrimPrefix(eval(`location.hash`).(string), "#runs/")
	waitFor("live output while the run executes",
		`document.getElementById('run-log').textContent.includes('tick-0') && document.getElementById('run-status').dataset.status === 'EXECUTING'`, 2*time.Minute)
	b.shot("run-live")
	waitFor("the run's end", `document.getElementById('run-status').dataset.status === 'COMPLETED'`, 2*time.Minute)
	log := eval(`document.getElementById('run-log').textContent`).(string)
	for _, want := range []string{"[stdout] console-start", "[stdout] tick-4\n", "[stderr] console-done"} {
		if !strings.Contains(log, want) {
			t.Errorf("the run's log lacks %q:\n%s", want, log)
		}
	}
	if st := eval(`document.getElementById('run-status').textContent`).(string); !strings.Contains(st, "exit 0") {
		t.Errorf("run status %q", st)
	}
	waitFor("the run in the list", fmt.Sprintf(`!!document.querySelector('#runs-body tr[data-run=%q][data-status="COMPLETED"]')`, runID), 30*time.Second)
	b.shot("run")

	// The sandbox, running, with its time counting down.
	goTo("#sandboxes") // the sandboxes
	waitFor("a running sandbox", `!!document.querySelector('#sandboxes-body tr[data-status="running"] [data-deadline]')`, time.Minute)
	sandboxID := eval(`document.querySelector('#sandboxes-body tr[data-status="running"]').dataset.sandbox`).(string)
	first := eval(`document.querySelector('#sandboxes-body [data-deadline]').textContent`).(string)
	waitFor("the time counting down", fmt.Sprintf(`(() => { const t = document.querySelector('#sandboxes-body [data-deadline]').textContent; return t !== %q && t.startsWith('9m'); })()`, first), 30*time.Second)
	b.shot("sandboxes")
	// Its page: extend it by 10 minutes.
	b.press("open the sandbox", fmt.Sprintf(`#sandboxes-body tr[data-sandbox=%q] a`, sandboxID))
	waitFor("the sandbox's page", fmt.Sprintf(`location.hash === '#sandbox/%s' && document.getElementById('view-sandbox').dataset.status === 'running'`, sandboxID), 30*time.Second)
	b.press("extend", "#sb-extend")
	waitFor("the extension", `document.querySelector('#sb-fields [data-deadline]').textContent.startsWith('19m')`, 30*time.Second)
	if _, left := s.sandboxStatus(k, sandboxID); left < 18*60000 {
		t.Errorf("the API says %v ms left after the console extended it by 10 minutes", left)
	}
	b.shot("sandbox")

	// Files: Python highlighted (markup in it stays text), an image shown.
	goTo("#files") // the files
	waitFor("the tree", `!!document.querySelector('#tree button.file[data-path="hello.py"]')`, 30*time.Second)
	click("open hello.py", `#tree button.file[data-path="hello.py"]`)
	waitFor("the highlighted file", `!!document.querySelector('#preview-text .tok-kw')`, 30*time.Second)
	if got := eval(`[...document.querySelectorAll('#preview-text .tok-kw')].map((e) => e.textContent).join(' ')`).(string); !strings.Contains(got, "def") || !strings.Contains(got, "return") {
		t.Errorf("keywords highlighted: %q", got)
	}
	if got := eval(`document.querySelector('#preview-text .tok-com').textContent`).(string); got != "# a greeting" {
		t.Errorf("comment: %q", got)
	}
	if eval(`document.querySelector('#preview-text b') === null && document.getElementById('preview-text').textContent.includes('<b>not markup</b>')`) != true {
		t.Error("markup in a file was parsed as HTML")
	}
	b.shot("file")
	goTo("#files/img%2Flogo.png") // open the image
	waitFor("the image", `(() => { const i = document.getElementById('preview-image'); return i && i.complete && i.naturalWidth === 96 && i.src.startsWith('blob:'); })()`, 30*time.Second)
	if eval(`document.querySelector('#tree button.file[data-path="img/logo.png"]').closest('details').open`) != true {
		t.Error("the image's folder did not open in the tree")
	}
	b.shot("image")
	goTo("#files/report.pdf") // open the PDF
	waitFor("the PDF", `(() => { const f = document.getElementById('preview-pdf'); return f && f.src.startsWith('blob:'); })()`, 30*time.Second)
	time.Sleep(time.Second) // the viewer draws the page
	b.shot("pdf")

	// Snapshots: the history the API lists, the current one marked.
	goTo("#snapshots") // the snapshots
	waitFor("the snapshot list", `document.getElementById('snapshots-current').textContent !== ''`, 30*time.Second)
	if snap, _ := s.as(k, "GET", "/api/snapshots", nil).Body["snapshot_id"].(string); snap != "" {
		waitFor("the current snapshot", fmt.Sprintf(`!!document.querySelector('#snapshots-body tr[data-snapshot=%q] .badge')`, snap), 30*time.Second)
	}
	b.shot("snapshots")

	// A terminal into the running sandbox: what is typed runs in its shell.
	goTo("#terminal/" + sandboxID)
	waitFor("the sandbox to connect to", fmt.Sprintf(`document.getElementById('term-sandbox').value === %q && !document.getElementById('term-connect').disabled`, sandboxID), 30*time.Second)
	do("connect", chromedp.Click(chromedp.ID("term-connect")))
	waitFor("the connection", `document.getElementById('term-state').textContent.startsWith('connected')`, time.Minute)
	do("type", chromedp.SendKeys(chromedp.ID("term"), "echo term-$((6*7)) $TERM\r"))
	waitFor("the command's output", `/term-42 dumb/.test(document.getElementById('term').textContent)`, time.Minute)
	if txt := eval(`document.getElementById('term').textContent`).(string); strings.Contains(txt, "\x1b") {
		t.Errorf("escape sequences in the terminal: %q", txt)
	}
	b.shot("terminal")
	do("exit the shell", chromedp.SendKeys(chromedp.ID("term"), "exit 3\r"))
	waitFor("the shell's exit", `document.getElementById('term').textContent.includes('[exited with status 3]')`, time.Minute)

	// Stop the sandbox from its page.
	goTo("#sandbox/" + sandboxID)
	b.press("stop", "#sb-stop")
	waitFor("the stop", `document.getElementById('view-sandbox').dataset.status === 'stopped'`, time.Minute)
	if st, _ := s.sandboxStatus(k, sandboxID); st != "stopped" {
		t.Errorf("the API says %s after the console stopped it", st)
	}
	goTo("#sandboxes")
	waitFor("the stopped row", fmt.Sprintf(`!!document.querySelector('#sandboxes-body tr[data-sandbox=%q][data-status="stopped"]')`, sandboxID), 30*time.Second)
	b.keyNowhere("before sign-out", k.Key)

	// River's UI, for operators: the run's job is there behind the
	// operators' key, which an account key is not.
	riverUI := func(pass string) (int, string) {
		req, _ := http.NewRequest("GET", s.base+"/riverui/api/jobs?state=completed&limit=20", nil)
		if pass != "" {
			req.SetBasicAuth("operator", pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}
	for _, pass := range []string{"", k.Key} {
		if code, _ := riverUI(pass); code != http.StatusUnauthorized {
			t.Errorf("River's UI with %q: %d, want 401", pass, code)
		}
	}
	if code, body := riverUI(adminKey); code != 200 || !strings.Contains(body, "run-sandbox-command") || !strings.Contains(body, runID) {
		t.Errorf("River's UI with the operators' key: %d %.300s", code, body)
	}

	// Sign out: the key is gone and the data with it.
	do("sign out", chromedp.Click(chromedp.ID("signout")), chromedp.WaitVisible(chromedp.ID("key")))
	if eval(`sessionStorage.getItem('sandboxd.key') === null && document.getElementById('sandboxes-body').children.length === 0`) != true {
		t.Error("sign-out left the key or the data")
	}
}

// shot saves a screenshot of the page as dir/name.png.
func shot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	shotCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	buf, err := chromedp.Run(shotCtx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	if _, err := png.DecodeConfig(bytes.NewReader(buf)); err != nil {
		t.Errorf("screenshot %s is not a PNG: %v", name, err)
		return
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644); err != nil {
		t.Errorf("save screenshot %s: %v", name, err)
	}
}
