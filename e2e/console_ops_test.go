package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// consoleProxy is the origin the browser loads the console from, passing
// everything to the server (the websocket and event streams included). It
// can add what a server says when it is degraded, or why a sandbox
// failed, to the server's answers where they lack it: the console's tests
// show these as the API sends them without having to break a server. A
// server that sends the fields itself is passed through unchanged.
type consoleProxy struct {
	srv *httptest.Server

	mu            sync.Mutex
	target        *url.URL
	degraded      []string // added to /api/health while not nil
	failureReason string   // added to failed sandboxes that give none, while not ""
}

func newConsoleProxy(t *testing.T, target string) *consoleProxy {
	t.Helper()
	p := &consoleProxy{}
	p.retarget(t, target)
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			p.mu.Lock()
			r.SetURL(p.target)
			p.mu.Unlock()
			r.Out.Host = r.In.Host
		},
		ModifyResponse: p.modify,
	}
	p.srv = httptest.NewServer(rp)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *consoleProxy) retarget(t *testing.T, target string) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.target = u
	p.mu.Unlock()
}

func (p *consoleProxy) setDegraded(reasons []string) {
	p.mu.Lock()
	p.degraded = reasons
	p.mu.Unlock()
}

func (p *consoleProxy) setFailureReason(reason string) {
	p.mu.Lock()
	p.failureReason = reason
	p.mu.Unlock()
}

func (p *consoleProxy) modify(resp *http.Response) error {
	r := resp.Request
	if r.Method != http.MethodGet || resp.StatusCode != http.StatusOK || (r.URL.Path != "/api/health" && r.URL.Path != "/api/sandboxes") {
		return nil
	}
	p.mu.Lock()
	degraded, reason := p.degraded, p.failureReason
	p.mu.Unlock()
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err == nil {
		changed := false
		if r.URL.Path == "/api/health" && degraded != nil {
			if _, ok := body["degraded"]; !ok {
				body["degraded"], changed = degraded, true
			}
		}
		if sbs, ok := body["sandboxes"].([]any); ok && r.URL.Path == "/api/sandboxes" && reason != "" {
			for _, v := range sbs {
				if sb, ok := v.(map[string]any); ok && sb["sandboxStatus"] == "failed" {
					if _, has := sb["failureReason"]; !has {
						sb["failureReason"], changed = reason, true
					}
				}
			}
		}
		if changed {
			if raw, err = json.Marshal(body); err != nil {
				return err
			}
		}
	}
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	resp.ContentLength = int64(len(raw))
	resp.Header.Set("Content-Length", strconv.Itoa(len(raw)))
	return nil
}

// get is a GET of the API through the proxy, as the console sees it.
func (p *consoleProxy) get(t *testing.T, k key, path string) map[string]any {
	t.Helper()
	req, _ := http.NewRequest("GET", p.srv.URL+path, nil)
	req.Header.Set("x-api-key", k.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
	}
	return out
}

// apiSandbox is one sandbox as the API lists it.
func (s *server) apiSandbox(k key, id string) map[string]any {
	s.t.Helper()
	r := s.as(k, "GET", "/api/sandboxes?sandbox_id="+id, nil)
	sbs, _ := r.Body["sandboxes"].([]any)
	if r.Status != 200 || len(sbs) != 1 {
		s.t.Fatalf("get sandbox %s: %d %s", id, r.Status, r.Raw)
	}
	return sbs[0].(map[string]any)
}

// processes are the pids of a sandbox's processes whose command line
// contains what.
func (s *server) processes(k key, id, what string) []int {
	s.t.Helper()
	r := s.as(k, "GET", "/api/sandboxes/"+id+"/processes", nil)
	if r.Status != 200 {
		s.t.Fatalf("processes of %s: %d %s", id, r.Status, r.Raw)
	}
	var pids []int
	for _, v := range r.Body["processes"].([]any) {
		p := v.(map[string]any)
		if strings.Contains(fmt.Sprint(p["command"]), what) {
			pids = append(pids, int(p["pid"].(float64)))
		}
	}
	return pids
}

// forksOf are the account's sandboxes forked from id that are running.
func (s *server) forksOf(k key, id string) []string {
	s.t.Helper()
	var out []string
	for _, v := range s.as(k, "GET", "/api/sandboxes", nil).Body["sandboxes"].([]any) {
		sb := v.(map[string]any)
		if sb["forkedFrom"] == id && sb["sandboxStatus"] == "running" {
			out = append(out, sb["sandboxId"].(string))
		}
	}
	return out
}

// TestConsoleOperations drives what an operator does in the console, at a
// desktop's width (1280×800) and a phone's (390×844): at each, every view
// fits the window (nothing wider than it) and every action is clicked
// where a user could click it (shown, inside the window, not covered) and
// its effect checked through the API: create a sandbox with a network and
// a timeout in minutes, see every field of it, run a command and see its
// output, list its processes and kill one, extend its timeout, change its
// network, pause, resume, fork it, open a terminal with a blinking cursor,
// stop it; list sandboxes with filters and open a failed one, which shows
// why it failed; see a run that exited non-zero as a failure with its exit
// code, a prompt's run as a prompt, each run's sandbox; follow a run's
// log; upload files; read a timeout's error in minutes; see the banner of
// a degraded server. Screenshots of each view at each width are saved.
func TestConsoleOperations(t *testing.T) {
	chromium(t)
	shots := artifactsDir(t, "console-operations")
	dsn := filepath.Join(t.TempDir(), "console.db")
	s := startServer(t, dsn)
	a := s.createAccount("operator", false)
	k := s.createKey(a.ID)

	// A sandbox that failed: its runtime lost it while sandboxd was down.
	lost := s.createSandbox(k, map[string]any{})["sandboxId"].(string)
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = s.cmd.Wait()
	if err := os.Remove(filepath.Join(s.dataDir, "runtime", "gvisor", "ids", lost)); err != nil {
		t.Fatal(err)
	}
	s = restartServer(t, s)
	if st, _ := s.sandboxStatus(k, lost); st != "failed" {
		t.Fatalf("the lost sandbox is %s, want failed", st)
	}
	defer s.stopAll(k)

	// A command that exits 3, and a run shaped as a prompt's (opencode run
	// PROMPT; the test image has no opencode, so it fails at once).
	failing := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", "echo oops >&2; exit 3"}})
	prompt := s.createSandbox(k, map[string]any{"command": "opencode", "args": []string{"run", "write a haiku about <b>sandboxes</b>"}})
	failingRun, promptRun := failing["runId"].(string), prompt["runId"].(string)
	if r := s.waitRun(k, failingRun, 2*time.Minute); r.Status != "COMPLETED" || r.Output["exitCode"] != 3.0 {
		t.Fatalf("the failing run: %s %v", r.Status, r.Output)
	}
	s.waitRun(k, promptRun, 2*time.Minute)
	for _, sb := range []map[string]any{failing, prompt} {
		s.as(k, "POST", "/api/sandboxes/"+sb["sandboxId"].(string)+"/stop", map[string]any{})
	}

	p := newConsoleProxy(t, s.base)
	b := newConsoleBrowser(t, shots)
	b.signIn(p.srv.URL, k.Key)

	for _, size := range []struct {
		name          string
		width, height int64
		forks         int
	}{
		{"desktop", 1280, 800, 2},
		{"phone", 390, 844, 1},
	} {
		outer := t
		t.Run(size.name, func(t *testing.T) {
			b.t = t
			defer func() { b.t = outer }()
			b.viewport(size.width, size.height)
			consoleOperations(t, s, k, p, b, size.name, size.forks, lost, failingRun, promptRun)
		})
	}
}

// consoleOperations is TestConsoleOperations at one width, named size
// (its screenshots' prefix), forking forks sandboxes.
func consoleOperations(t *testing.T, s *server, k key, p *consoleProxy, b *consoleBrowser, size string, forks int, lost, failingRun, promptRun string) {
	shot := func(name string) { b.shot(size + "-" + name) }
	// A degraded server: a banner says why, as text; it goes when the
	// server is well again.
	p.setDegraded([]string{"blob store unreachable: <b>s3</b>", "disk 97% full"})
	b.goTo("#sandboxes")
	b.waitFor("the degraded banner", `(() => { const h = document.getElementById('health');
		return !h.hidden && h.textContent.includes('blob store unreachable: <b>s3</b>') && h.textContent.includes('disk 97% full') && !h.querySelector('b'); })()`, time.Minute)
	b.noOverflow("the degraded banner")
	shot("degraded")
	p.setDegraded(nil)
	b.goTo("#runs")
	b.waitFor("the banner gone", `document.getElementById('health').hidden`, time.Minute)

	// A timeout out of bounds is refused in minutes, as it was asked.
	b.goTo("#sandboxes")
	b.fill("choose nothing to run", "#new-kind", "none")
	b.fill("a timeout of 100000 minutes", "#new-timeout", "100000")
	b.press("create", "#create")
	b.waitFor("the refusal", `!document.getElementById('create-error').hidden`, time.Minute)
	if msg := b.text("#create-error"); !strings.Contains(msg, "1440 minutes") || strings.Contains(msg, "86400000") || strings.Contains(msg, " ms") {
		t.Errorf("the refusal of a timeout too long says %q, want it in minutes (1440 minutes)", msg)
	}

	// Create a sandbox with a network and a timeout of 30 minutes.
	before := len(s.as(k, "GET", "/api/sandboxes", nil).Body["sandboxes"].([]any))
	b.fill("a timeout of 30 minutes", "#new-timeout", "30")
	b.fill("a network", "#new-network", "egress")
	b.press("create", "#create")
	b.waitFor("the new sandbox's page", `location.hash.startsWith('#sandbox/') && document.getElementById('view-sandbox').dataset.status === 'running'`, 2*time.Minute)
	id := strings.TrimPrefix(b.eval(`location.hash`).(string), "#sandbox/")
	sb := s.apiSandbox(k, id)
	if n := len(s.as(k, "GET", "/api/sandboxes", nil).Body["sandboxes"].([]any)); n != before+1 {
		t.Errorf("%d sandboxes after the console created one, %d before", n, before)
	}
	if sb["network"] != "egress" || sb["timeout"].(float64) < 29*60000 || sb["timeout"].(float64) > 30*60000 {
		t.Errorf("the sandbox the console created: network %v, timeout %v ms; want egress, 30 minutes", sb["network"], sb["timeout"])
	}
	// Every field the API gives is on its page (waited for as one: the
	// page renders its fields again as it refreshes).
	fields := make([]string, 0, len(sb))
	for field := range sb {
		fields = append(fields, field)
	}
	list, _ := json.Marshal(fields)
	b.waitFor("every field on the page", fmt.Sprintf(`%s.every((f) => !!document.querySelector('#sb-fields [data-field="' + f + '"]'))`, list), 30*time.Second)
	if got := b.text(`#sb-fields [data-field="sandboxId"] dd`); got != id {
		t.Errorf("the page shows id %q, want %q", got, id)
	}
	b.noOverflow("a sandbox's page")
	shot("sandbox")

	// Exec: its output, stdout and stderr, and its exit code; what it did
	// stays in the sandbox.
	b.fill("a command", "#exec-command", "echo exec-out; echo exec-err >&2; echo made-by-console > /tmp/console-made; exit 4")
	b.press("run it", "#exec-run")
	b.waitFor("its end", `document.getElementById('exec-status').dataset.exit === '4'`, time.Minute)
	if out, errOut := b.text("#exec-output"), b.text("#exec-output .stderr"); !strings.Contains(out, "exec-out\n") || errOut != "exec-err\n" {
		t.Errorf("exec output %q, stderr %q", out, errOut)
	}
	if st := b.text("#exec-status"); !strings.Contains(st, "exit 4") {
		t.Errorf("exec status %q", st)
	}
	if r := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "cat", "args": []string{"/tmp/console-made"}}); r.Body["stdout"] != "made-by-console\n" {
		t.Errorf("what the console's command wrote: %d %s", r.Status, r.Raw)
	}
	b.noOverflow("a command's output")
	shot("exec")

	// Processes: one that outlived its client is listed, and killed.
	s.hangUp(k, "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "echo started; exec sleep 600"}})
	pids := s.processes(k, id, "sleep")
	if len(pids) != 1 {
		t.Fatalf("sleep processes: %v", pids)
	}
	b.press("list the processes", "#procs-refresh")
	row := fmt.Sprintf(`#procs-body tr[data-pid="%d"]`, pids[0])
	b.waitFor("the process listed", fmt.Sprintf(`!!document.querySelector('%s')`, row), 30*time.Second)
	b.noOverflow("the processes")
	shot("processes")
	b.fill("a signal", "#procs-signal", "SIGTERM")
	b.press("kill it", row+" button.kill")
	b.waitFor("the process gone from the list", fmt.Sprintf(`!document.querySelector('%s')`, row), 30*time.Second)
	if left := s.processes(k, id, "sleep"); len(left) != 0 {
		t.Errorf("the API still lists %v after the console killed it", left)
	}

	// Extend its timeout by 20 minutes.
	_, left := s.sandboxStatus(k, id)
	b.fill("20 minutes", "#sb-extend-minutes", "20")
	b.press("extend", "#sb-extend")
	deadline := time.Now().Add(time.Minute)
	for _, now := s.sandboxStatus(k, id); now < left+19*60000; _, now = s.sandboxStatus(k, id) {
		if time.Now().After(deadline) {
			t.Fatalf("the API says %v ms left after extending %v ms by 20 minutes", now, left)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Change its network: an allow list.
	b.fill("an allow list", "#sb-network-kind", "allow")
	b.fill("its entries", "#sb-network-allow", "198.51.100.7, example.com")
	b.press("apply", "#sb-network-apply")
	b.waitFor("the new policy shown", `document.querySelector('#sb-fields [data-field="network"] dd').textContent === 'allow: 198.51.100.7, example.com'`, time.Minute)
	if got, _ := json.Marshal(s.apiSandbox(k, id)["network"]); string(got) != `{"allow":["198.51.100.7","example.com"]}` {
		t.Errorf("the API says the network is %s", got)
	}

	// Pause, then resume.
	b.press("pause", "#sb-pause")
	b.waitFor("paused", `document.getElementById('view-sandbox').dataset.status === 'paused'`, 2*time.Minute)
	if st, _ := s.sandboxStatus(k, id); st != "paused" {
		t.Errorf("the API says %s after the console paused it", st)
	}
	b.noOverflow("a paused sandbox's page")
	shot("paused")
	b.press("resume", "#sb-resume")
	b.waitFor("running again", `document.getElementById('view-sandbox').dataset.status === 'running'`, 2*time.Minute)
	if st, _ := s.sandboxStatus(k, id); st != "running" {
		t.Errorf("the API says %s after the console resumed it", st)
	}

	// Pause its files alone, then resume: the page says which pause.
	b.press("pause files only", "#sb-pause-files")
	b.waitFor("paused with its files", `document.getElementById('view-sandbox').dataset.status === 'paused' && (document.querySelector('#sb-fields [data-field="pausedFiles"] dd') || {}).textContent.startsWith('its files alone')`, 2*time.Minute)
	if sb := s.apiSandbox(k, id); sb["pausedFiles"] != true {
		t.Errorf("the API says %v after the console paused its files", sb)
	}
	b.press("resume", "#sb-resume")
	b.waitFor("running again", `document.getElementById('view-sandbox').dataset.status === 'running'`, 2*time.Minute)

	// Fork it.
	b.fill("how many", "#sb-fork-count", strconv.Itoa(forks))
	b.press("fork", "#sb-fork")
	b.waitFor("the forks listed", fmt.Sprintf(`document.querySelectorAll('#fork-result [data-forked]').length === %d`, forks), 2*time.Minute)
	children := s.forksOf(k, id)
	shown := strings.Fields(b.eval(`[...document.querySelectorAll('#fork-result [data-forked]')].map((e) => e.dataset.forked).join(' ')`).(string))
	slices.Sort(children)
	slices.Sort(shown)
	if len(children) != forks || !slices.Equal(children, shown) {
		t.Errorf("forks: the API has %v, the console shows %v", children, shown)
	}
	shot("forked")
	for _, c := range children {
		s.as(k, "POST", "/api/sandboxes/"+c+"/stop", map[string]any{})
	}

	// Snapshot it, and start a sandbox from the snapshot.
	snapName := "console-" + size
	b.fill("the snapshot's name", "#sb-snapshot-name", snapName)
	b.press("snapshot", "#sb-snapshot")
	b.waitFor("the snapshot saved", fmt.Sprintf(`!!document.querySelector('#snapshot-result [data-snapshot="%s:latest"]')`, snapName), 2*time.Minute)
	if r := s.as(k, "GET", "/api/snapshots/"+snapName, nil); r.Status != 200 {
		t.Errorf("the snapshot the console saved: %d %s", r.Status, r.Raw)
	}
	b.waitFor("the snapshot among its events", `!!document.querySelector('#events-body [data-event="sandbox.snapshot"]')`, time.Minute)
	shot("snapshotted")
	b.press("start a sandbox from it", "#snapshot-result button")
	b.waitFor("the new sandbox's page", fmt.Sprintf(`location.hash.startsWith('#sandbox/') && location.hash !== '#sandbox/%s' && document.getElementById('view-sandbox').dataset.status === 'running'`, id), 2*time.Minute)
	fromSnap := strings.TrimPrefix(b.eval(`decodeURIComponent(location.hash)`).(string), "#sandbox/")
	if r := s.as(k, "GET", "/api/sandboxes?sandboxId="+fromSnap, nil); r.Status != 200 || !strings.Contains(string(r.Raw), `"templateId"`) {
		t.Errorf("the sandbox the console started from the snapshot: %d %s", r.Status, r.Raw)
	}
	s.as(k, "POST", "/api/sandboxes/"+fromSnap+"/stop", map[string]any{})
	b.goTo("#sandbox/" + id)
	b.waitFor("back on the sandbox", `document.getElementById('view-sandbox').dataset.status === 'running'`, time.Minute)

	// The terminal, from its page: a blinking cursor after the prompt.
	b.press("open a terminal", "#sb-terminal")
	b.waitFor("the sandbox to connect to", fmt.Sprintf(`location.hash === '#terminal/%s' && document.getElementById('term-sandbox').value === %q && !document.getElementById('term-connect').disabled`, id, id), 30*time.Second)
	b.press("connect", "#term-connect")
	b.waitFor("the connection", `document.getElementById('term-state').textContent.startsWith('connected')`, time.Minute)
	b.do("type", chromedp.SendKeys(chromedp.ID("term"), "echo term-$((6*7))\r"))
	b.waitFor("the command's output", `/term-42/.test(document.getElementById('term').textContent)`, time.Minute)
	if got := b.eval(`(() => { const c = document.querySelector('#term .cursor'); if (!c) return 'no cursor';
		const r = c.getBoundingClientRect(), st = getComputedStyle(c);
		if (c.hidden || r.width === 0 || r.height === 0) return 'a cursor not shown';
		if (st.animationName === 'none' || st.animationIterationCount !== 'infinite') return 'a cursor that does not blink: ' + st.animationName + ' ' + st.animationIterationCount;
		if (c !== c.parentNode.lastChild) return 'a cursor not after the text';
		return ''; })()`); got != "" {
		t.Errorf("the terminal's cursor: %v", got)
	}
	b.noOverflow("the terminal")
	shot("terminal")
	b.press("disconnect", "#term-disconnect")
	b.waitFor("disconnected, the cursor hidden", `document.getElementById('term-state').textContent === '' && document.querySelector('#term .cursor').hidden`, 30*time.Second)

	// Stop it from its page.
	b.goTo("#sandbox/" + id)
	b.press("stop", "#sb-stop")
	b.waitFor("stopped", `document.getElementById('view-sandbox').dataset.status === 'stopped'`, time.Minute)
	if st, _ := s.sandboxStatus(k, id); st != "stopped" {
		t.Errorf("the API says %s after the console stopped it", st)
	}

	// The list, filtered: the failed sandbox opens and says why it failed
	// (an older server gives no reason: the page says that).
	b.goTo("#sandboxes")
	b.fill("only failed ones", "#sb-filter-status", "failed")
	b.waitFor("only the failed sandbox", fmt.Sprintf(`(() => { const rows = document.querySelectorAll('#sandboxes-body tr');
		return rows.length === 1 && rows[0].dataset.sandbox === %q; })()`, lost), 30*time.Second)
	b.noOverflow("the sandboxes")
	shot("sandboxes-failed")
	reason, _ := p.get(t, k, "/api/sandboxes?sandbox_id="+lost)["sandboxes"].([]any)[0].(map[string]any)["failureReason"].(string)
	b.press("open the failed sandbox", fmt.Sprintf(`#sandboxes-body tr[data-sandbox=%q] a`, lost))
	b.waitFor("its page", fmt.Sprintf(`location.hash === '#sandbox/%s' && document.getElementById('view-sandbox').dataset.status === 'failed' && !document.getElementById('sb-failure').hidden`, lost), 30*time.Second)
	if got := b.text("#sb-failure"); reason == "" && !strings.Contains(got, "no reason") || reason != "" && !strings.Contains(got, reason) {
		t.Errorf("the failed sandbox's page says %q; the API's reason is %q", got, reason)
	}
	// With a reason (added by the proxy when the server gives none): shown
	// in the list and on its page, as text.
	if reason == "" {
		reason = "the sandbox process exited unexpectedly <i>(test)</i>"
		p.setFailureReason(reason)
		defer p.setFailureReason("")
	}
	b.waitFor("the reason on its page", fmt.Sprintf(`document.getElementById('sb-failure').textContent.includes(%q) && document.querySelector('#sb-fields [data-field="failureReason"] dd').textContent === %q`, reason, reason), time.Minute)
	b.noOverflow("a failed sandbox's page")
	shot("failed-sandbox")
	b.goTo("#sandboxes")
	b.waitFor("the reason in the list", fmt.Sprintf(`(document.querySelector('#sandboxes-body tr[data-sandbox=%q] .reason') || {}).textContent === %q && !document.querySelector('#sandboxes-body i')`, lost, reason), time.Minute)
	b.fill("every status", "#sb-filter-status", "")
	b.fill("an id", "#sb-filter-text", id[:12])
	b.waitFor("the filtered list", fmt.Sprintf(`(() => { const rows = document.querySelectorAll('#sandboxes-body tr');
		return rows.length >= 1 && [...rows].every((r) => r.dataset.sandbox.startsWith(%q)) && [...rows].some((r) => r.dataset.sandbox === %q); })()`, id[:12], id), 30*time.Second)
	b.fill("no filter", "#sb-filter-text", "")
	// Every page: as many as the API's pages hold.
	var all []string
	for cursor := ""; ; {
		r := s.as(k, "GET", "/api/sandboxes?limit=100&cursor="+url.QueryEscape(cursor), nil)
		for _, v := range r.Body["sandboxes"].([]any) {
			all = append(all, v.(map[string]any)["sandboxId"].(string))
		}
		if cursor = r.Header.Get("X-Next-Cursor"); cursor == "" {
			break
		}
	}
	b.press("every page", "#sb-all")
	b.waitFor("every sandbox", fmt.Sprintf(`document.querySelectorAll('#sandboxes-body tr').length === %d && document.getElementById('sb-count').textContent === '%d'`, len(all), len(all)), 30*time.Second)
	b.press("the first page again", "#sb-all")

	// Runs: the failing command red with its exit code, the prompt's run
	// labelled a prompt, each with its sandbox, which opens.
	b.goTo("#runs")
	failRow := fmt.Sprintf(`#runs-body tr[data-run=%q]`, failingRun)
	promptRow := fmt.Sprintf(`#runs-body tr[data-run=%q]`, promptRun)
	b.waitFor("the runs", fmt.Sprintf(`!!document.querySelector('%s') && !!document.querySelector('%s')`, failRow, promptRow), 30*time.Second)
	if got := b.eval(fmt.Sprintf(`(() => { const b = document.querySelector('%s .badge');
		return b.dataset.outcome + '|' + b.className + '|' + b.textContent + '|' + getComputedStyle(b).color; })()`, failRow)).(string); !strings.HasPrefix(got, "failure|badge st-failed|COMPLETED · exit 3|rgb(207, 34, 46)") {
		t.Errorf("the run that exited 3 shows as %q, want a red failure with its exit code", got)
	}
	if got := b.text(promptRow + " td.kind"); got != "prompt" {
		t.Errorf("the prompt's run is labelled %q", got)
	}
	for run, sb := range map[string]string{failingRun: sandboxOfRun(t, s, k, failingRun), promptRun: sandboxOfRun(t, s, k, promptRun)} {
		if got := b.text(fmt.Sprintf(`#runs-body tr[data-run=%q] td.sandbox a`, run)); got != sb {
			t.Errorf("run %s: the sandbox column says %q, want %q", run, got, sb)
		}
	}
	b.fill("only failures", "#runs-filter-status", "failure")
	b.waitFor("failures only", fmt.Sprintf(`!!document.querySelector('%s') && [...document.querySelectorAll('#runs-body tr')].every((r) => r.dataset.outcome === 'failure')`, failRow), 30*time.Second)
	b.fill("every run", "#runs-filter-status", "")
	// Follow the failing run's log.
	b.press("open the failing run", failRow+" a")
	b.waitFor("its log and end", `document.getElementById('run-log').textContent.includes('[stderr] oops') && document.getElementById('run-status').dataset.outcome === 'failure'`, time.Minute)
	if st := b.text("#run-status"); !strings.Contains(st, "exit 3") {
		t.Errorf("the failing run's status says %q", st)
	}
	b.noOverflow("a run's log")
	shot("run-failed")
	b.press("open the prompt's run", promptRow+" a")
	b.waitFor("its prompt", `document.getElementById('run-command-label').textContent === 'Prompt' && document.getElementById('run-command').textContent === 'write a haiku about <b>sandboxes</b>'`, time.Minute)
	b.press("open the prompt's sandbox", promptRow+" td.sandbox a")
	b.waitFor("the prompt's sandbox", fmt.Sprintf(`location.hash === '#sandbox/%s' && !!document.getElementById('view-sandbox').dataset.status`, sandboxOfRun(t, s, k, promptRun)), 30*time.Second)

	// Upload two files into a directory; the repository has them.
	dir := t.TempDir()
	files := map[string]string{"notes-" + size + ".md": "# notes\n<script>alert(1)</script>\n", "data-" + size + ".csv": "a,b\n1,2\n"}
	var paths []string
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
	}
	b.goTo("#files")
	b.do("choose files", chromedp.SetUploadFiles(chromedp.ID("upload-files"), paths))
	b.fill("a directory", "#upload-path", "inputs")
	b.press("upload", "#upload")
	b.waitFor("the upload", `document.getElementById('upload-result').textContent.startsWith('Uploaded')`, time.Minute)
	for name, content := range files {
		r := s.as(k, "GET", "/api/sandboxes/file?path=inputs/"+name, nil)
		if r.Status != 200 || r.Body["content"] != content {
			t.Errorf("inputs/%s in the repository: %d %s", name, r.Status, r.Raw)
		}
		b.waitFor("the file in the tree", fmt.Sprintf(`!!document.querySelector('#tree button.file[data-path="inputs/%s"]')`, name), 30*time.Second)
	}
	b.noOverflow("the files")
	shot("files")

	b.goTo("#snapshots")
	b.waitFor("the snapshots", `document.getElementById('snapshots-current').textContent !== ''`, 30*time.Second)
	b.noOverflow("the snapshots")

	consoleVolumes(t, s, k, b, size)
}

// consoleVolumes: a volume created on the Volumes page, a second of its
// name refused with the API's message, mounted in a new sandbox from its
// row, its delete refused while the sandbox holds it (409 shown), deleted
// once the sandbox stopped.
func consoleVolumes(t *testing.T, s *server, k key, b *consoleBrowser, size string) {
	name := "vol-" + size
	row := fmt.Sprintf(`#volumes-body tr[data-volume=%q]`, name)
	b.goTo("#volumes")
	b.fill("a volume's name", "#vol-name", name)
	b.fill("its size", "#vol-size", "128")
	b.press("create the volume", "#vol-create")
	b.waitFor("its row", fmt.Sprintf(`!!document.querySelector('%s')`, row), time.Minute)
	if r := s.as(k, "GET", "/api/volumes/"+name, nil); r.Status != 200 || r.Body["volume"].(map[string]any)["size_mb"] != 128.0 {
		t.Fatalf("the volume the console created: %d %s", r.Status, r.Raw)
	}
	b.fill("the same name", "#vol-name", name)
	b.press("create it again", "#vol-create")
	b.waitFor("the refusal", `!document.getElementById('vol-create-error').hidden && document.getElementById('vol-create-error').textContent.includes('has a volume called')`, time.Minute)
	b.noOverflow("the volumes")
	b.shot(size + "-volumes")

	b.press("mount it in a new sandbox", row+` button[data-action="mount"]`)
	b.waitFor("the create form with it chosen", fmt.Sprintf(`location.hash === '#sandboxes' && document.getElementById('new-volume').value === %q`, name), time.Minute)
	b.fill("choose nothing to run", "#new-kind", "none")
	b.fill("its path", "#new-volume-path", "/mnt/data")
	b.press("create", "#create")
	b.waitFor("the new sandbox's page", `location.hash.startsWith('#sandbox/') && document.getElementById('view-sandbox').dataset.status === 'running'`, 2*time.Minute)
	id := strings.TrimPrefix(b.eval(`location.hash`).(string), "#sandbox/")
	if out := shIn(t, s, k, id, "echo from-console > /mnt/data/x && cat /mnt/data/x"); out != "from-console\n" {
		t.Errorf("the volume in the sandbox the console created: %q", out)
	}

	b.goTo("#volumes")
	b.waitFor("it attached", fmt.Sprintf(`document.querySelector('%s')?.dataset.attached === 'yes' && !!document.querySelector('%s li[data-sandbox=%q]')`, row, row, id), time.Minute)
	b.press("delete it", row+` button[data-action="delete"]`)
	b.press("confirm", "#vol-delete-yes")
	b.waitFor("the 409", `document.getElementById('vol-error').dataset.status === '409'`, time.Minute)
	if msg := b.text("#vol-error"); !strings.Contains(msg, id) {
		t.Errorf("the refusal says %q, want the sandbox holding it", msg)
	}
	if r := s.as(k, "POST", "/api/sandboxes/"+id+"/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Raw)
	}
	b.goTo("#runs")
	b.goTo("#volumes")
	b.waitFor("it free", fmt.Sprintf(`document.querySelector('%s')?.dataset.attached === 'no'`, row), time.Minute)
	b.press("delete it", row+` button[data-action="delete"]`)
	b.press("confirm", "#vol-delete-yes")
	b.waitFor("its row gone", fmt.Sprintf(`!document.querySelector('%s')`, row), time.Minute)
	if r := s.as(k, "GET", "/api/volumes/"+name, nil); r.Status != 404 {
		t.Errorf("after the console deleted it: %d %s", r.Status, r.Raw)
	}
}

// sandboxOfRun is the sandbox a run ran in, as the API's run says (its
// sandboxId, or its payload's).
func sandboxOfRun(t *testing.T, s *server, k key, runID string) string {
	t.Helper()
	raw := s.rawRun(k, runID)
	if id, ok := raw["sandboxId"].(string); ok && id != "" {
		return id
	}
	payload, _ := raw["payload"].(map[string]any)
	id, _ := payload["sandboxId"].(string)
	if id == "" {
		t.Fatalf("run %s names no sandbox: %v", runID, raw)
	}
	return id
}
