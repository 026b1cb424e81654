package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestCodeInterpreter: the code interpreter of a sandbox from the
// code-interpreter template, through every front end: REST, the CLI and
// MCP on gVisor and on a microVM; E2B's code-interpreter SDK unchanged and
// the console's notebook on gVisor (they reach the same agent through the
// same routes on either backend).
func TestCodeInterpreter(t *testing.T) {
	buildImage(t, "code-interpreter")
	t.Run("gvisor", func(t *testing.T) { codeInterpreterOn(t, nil, true) })
	t.Run("microvm", func(t *testing.T) {
		if !microVMReady(t) {
			return
		}
		codeInterpreterOn(t, []string{"--runtime", "microvm"}, false)
	})
}

func codeInterpreterOn(t *testing.T, flags []string, everyFrontEnd bool) {
	s := startServer(t, "", append([]string{"--template", "code-interpreter"}, flags...)...)
	var k key
	s.admin(&k, "admin", "key", "create", "--account", s.createAccount("code", false).ID, "--format", "e2b", "--json")
	r := s.as(k, "POST", "/api/sandboxes", map[string]any{"timeout": 900_000})
	if r.Status != 200 {
		t.Fatalf("create: %d %s", r.Status, r.Raw)
	}
	id := r.Body["sandboxes"].([]any)[0].(map[string]any)["sandboxId"].(string)
	code := func(body map[string]any) map[string]any {
		t.Helper()
		r := s.as(k, "POST", "/api/sandboxes/"+id+"/code", body)
		if r.Status != 200 {
			t.Fatalf("code %v: %d %s", body, r.Status, r.Raw)
		}
		return r.Body
	}
	text := func(x map[string]any) string {
		for _, res := range x["results"].([]any) {
			if m := res.(map[string]any); m["is_main_result"] == true {
				s, _ := m["text"].(string)
				return s
			}
		}
		return ""
	}

	t.Run("rest", func(t *testing.T) {
		code(map[string]any{"code": "x = 41"})
		x := code(map[string]any{"code": "print('out')\nx + 1"})
		if text(x) != "42" || x["logs"].(map[string]any)["stdout"].([]any)[0] != "out\n" {
			t.Errorf("state and stdout: %v", x)
		}
		x = code(map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4], label='l')\nplt.show()"})
		res := x["results"].([]any)[0].(map[string]any)
		png, err := base64.StdEncoding.DecodeString(res["png"].(string))
		if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) || res["chart"].(map[string]any)["type"] != "line" {
			t.Errorf("chart: %v %v", err, res["chart"])
		}
		x = code(map[string]any{"code": "import pandas as pd\npd.DataFrame({'a': [1, 2]})"})
		res = x["results"].([]any)[0].(map[string]any)
		if d, _ := json.Marshal(res["data"]); string(d) != `{"a":[1,2]}` || !strings.Contains(res["html"].(string), "<table") {
			t.Errorf("DataFrame: %v", res)
		}
		x = code(map[string]any{"code": "raise ValueError('bad')"})
		if e := x["error"].(map[string]any); e["name"] != "ValueError" || e["value"] != "bad" || !strings.Contains(e["traceback"].(string), "raise ValueError('bad')") {
			t.Errorf("error: %v", x["error"])
		}
		start := time.Now()
		x = code(map[string]any{"code": "import time\ntime.sleep(120)", "timeout": 1500})
		if e, _ := x["error"].(map[string]any); e == nil || e["name"] != "TimeoutError" || time.Since(start) > time.Minute {
			t.Errorf("timeout: %v after %s", x, time.Since(start))
		}
		if got := text(code(map[string]any{"code": "x"})); got != "41" {
			t.Errorf("state after the timeout: %q", got)
		}
		// The kernel has the sandbox's environment, as an exec has.
		if got := text(code(map[string]any{"code": "import os\nos.environ.get('SANDBOX_ID')"})); got != id {
			t.Errorf("SANDBOX_ID in the kernel: %q, want %q", got, id)
		}
		x = code(map[string]any{"code": "import os\nos.environ['ONLY']", "envs": map[string]string{"ONLY": "here"}})
		if text(x) != "here" || text(code(map[string]any{"code": "import os\nos.environ.get('ONLY', 'gone')"})) != "gone" {
			t.Errorf("envs: %v", x)
		}
		// Output past the bounds: a result over 10 MiB is left out with
		// a note; an endless print loop streams and is cut by its timeout.
		x = code(map[string]any{"code": "from IPython.display import display\ndisplay({'text/plain': 'big', 'image/png': 'A' * (12 << 20)}, raw=True)"})
		res = x["results"].([]any)[0].(map[string]any)
		if res["png"] != nil || !strings.Contains(res["text"].(string), "image/png of 12582912 bytes left out") {
			t.Errorf("a result over the bound: %v", res["text"])
		}
		x = code(map[string]any{"code": "while True:\n    print('y' * 1000)", "timeout": 3000})
		var printed int
		for _, s := range x["logs"].(map[string]any)["stdout"].([]any) {
			printed += len(s.(string))
		}
		if x["error"].(map[string]any)["name"] != "TimeoutError" || printed > 1<<20+4<<10 || printed < 100_000 {
			t.Errorf("an endless print loop: %d bytes kept, truncated %v, error %v", printed, x["truncated"], x["error"])
		}
		// Contexts: another language, its own state, restart, remove.
		r := s.as(k, "POST", "/api/sandboxes/"+id+"/code/contexts", map[string]any{"language": "r", "cwd": "/tmp"})
		if r.Status != 200 {
			t.Fatalf("create an R context: %d %s", r.Status, r.Raw)
		}
		rctx := r.Body["context"].(map[string]any)["id"].(string)
		x = code(map[string]any{"code": "v <- c(1, 2, 3)\nsum(v * 2)", "contextId": rctx})
		if res := x["results"].([]any); len(res) != 1 || res[0].(map[string]any)["text"] != "[1] 12" {
			t.Errorf("R: %v", x)
		}
		r = s.as(k, "GET", "/api/sandboxes/"+id+"/code/contexts", nil)
		if cs, _ := r.Body["contexts"].([]any); r.Status != 200 || len(cs) != 2 {
			t.Errorf("list: %d %s", r.Status, r.Raw)
		}
		if r := s.as(k, "POST", "/api/sandboxes/"+id+"/code/contexts/"+rctx+"/restart", nil); r.Status != 200 {
			t.Errorf("restart: %d %s", r.Status, r.Raw)
		}
		if x := code(map[string]any{"code": "v", "contextId": rctx}); x["error"] == nil {
			t.Errorf("R state after restart: %v", x)
		}
		if r := s.as(k, "DELETE", "/api/sandboxes/"+id+"/code/contexts/"+rctx, nil); r.Status != 200 {
			t.Errorf("remove: %d %s", r.Status, r.Raw)
		}
		if r := s.as(k, "POST", "/api/sandboxes/"+id+"/code", map[string]any{"code": "1", "contextId": rctx}); r.Status != 404 {
			t.Errorf("a removed context: %d %s", r.Status, r.Raw)
		}
		if r := s.as(k, "POST", "/api/sandboxes/"+id+"/code", map[string]any{"code": "1", "language": "cobol"}); r.Status != 400 || !strings.Contains(string(r.Raw), `no kernel for language \"cobol\"`) {
			t.Errorf("an unknown language: %d %s", r.Status, r.Raw)
		}
		codeStreams(t, s, k, id)
	})
	t.Run("cli", func(t *testing.T) {
		cli := sandboxCLI(t, s, k)
		if r := cli(nil, "code", id, "--", "cli_var = 6 * 7; print('printed'); cli_var"); r.code != 0 || r.stdout != "printed\n42\n" {
			t.Errorf("code: %d %q %q", r.code, r.stdout, r.stderr)
		}
		if r := cli(nil, "code", id, "--", "1/0"); r.code != 1 || !strings.Contains(r.stderr, "ZeroDivisionError: division by zero") {
			t.Errorf("an exception: %d %q %q", r.code, r.stdout, r.stderr)
		}
		dir := t.TempDir()
		if r := cli(nil, "code", id, "--save", dir, "--", "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"); r.code != 0 {
			t.Errorf("save: %d %q %q", r.code, r.stdout, r.stderr)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "result-1.png")); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
			t.Errorf("the saved chart: %v", err)
		}
		r := cli(strings.NewReader("cli_var + 1"), "code", id, "--file", "-", "--json")
		var out map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != 0 || text(out) != "43" {
			t.Errorf("--file - --json: %d %q %v", r.code, r.stdout, err)
		}
		if r := cli(nil, "code", id, "--timeout", "1s", "--env", "CLI_ENV=set", "--", "import os, time\nprint(os.environ['CLI_ENV'], flush=True)\ntime.sleep(60)"); r.code != 1 ||
			r.stdout != "set\n" || !strings.Contains(r.stderr, "TimeoutError") {
			t.Errorf("--timeout and --env: %d %q %q", r.code, r.stdout, r.stderr)
		}
		if r := cli(nil, "code-context", "create", id, "--language", "python", "--cwd", "/tmp"); r.code != 0 || len(strings.TrimSpace(r.stdout)) != 36 {
			t.Errorf("code-context create: %d %q %q", r.code, r.stdout, r.stderr)
		} else if ls := cli(nil, "code-context", "ls", id); !strings.Contains(ls.stdout, strings.TrimSpace(r.stdout)) {
			t.Errorf("code-context ls: %q", ls.stdout)
		}
	})

	t.Run("mcp", func(t *testing.T) {
		c := s.mcpConnect(k)
		a := c.call(t, "run_code", map[string]any{"sandbox_id": id, "code": "mcp_var = 'kept'\nprint('hello')"}, "")
		if a.IsError || !strings.Contains(a.Text, "hello") {
			t.Errorf("run_code: %+v", a)
		}
		params := map[string]any{"sandbox_id": id, "code": "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.show()\nmcp_var"}
		res, err := c.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: params})
		if err != nil {
			t.Fatal(err)
		}
		var images, texts int
		for _, content := range res.Content {
			switch v := content.(type) {
			case *mcp.ImageContent:
				if v.MIMEType == "image/png" && bytes.HasPrefix(v.Data, []byte("\x89PNG")) {
					images++
				}
			case *mcp.TextContent:
				if strings.Contains(v.Text, "kept") {
					texts++
				}
			}
		}
		if images != 1 || texts != 1 {
			t.Errorf("run_code with a chart: %d images, %d texts with the value: %+v", images, texts, res.Content)
		}
		a = c.call(t, "run_code", map[string]any{"sandbox_id": id, "code": "import pandas as pd\npd.DataFrame({'col': [7, 8]})"}, "")
		if !strings.Contains(a.Text, "col") || !strings.Contains(a.Text, "8") {
			t.Errorf("a DataFrame as text: %q", a.Text)
		}
		a = c.call(t, "run_code", map[string]any{"sandbox_id": id, "code": "import os\nraise KeyError(os.environ['MCP_ENV'])", "envs": map[string]string{"MCP_ENV": "boom"}}, "")
		if a.IsError || !strings.Contains(a.Text, "[error] KeyError: 'boom'") || !strings.Contains(a.Text, "raise KeyError") {
			t.Errorf("an exception with envs: %+v", a)
		}
		a = c.call(t, "run_code", map[string]any{"sandbox_id": id, "code": "import time\ntime.sleep(60)", "timeout": 1000}, "")
		if !strings.Contains(a.Text, "[error] TimeoutError") {
			t.Errorf("a timeout: %+v", a)
		}
		if a := c.call(t, "run_code", map[string]any{"sandbox_id": id, "code": "mcp_var"}, ""); !strings.Contains(a.Text, "kept") {
			t.Errorf("the state after the timeout: %q", a.Text)
		}
	})
	if !everyFrontEnd {
		return
	}

	t.Run("access", func(t *testing.T) {
		securitytest.Attack(t, "code interpreter",
			"another account's key runs code in a sandbox of the first (REST POST .../code, a context's restart, MCP run_code)",
			"404 everywhere, as for any route of a sandbox not its own; no kernel is started or touched")
		other := s.createKey(s.createAccount("code-other", false).ID)
		if r := s.as(other, "POST", "/api/sandboxes/"+id+"/code", map[string]any{"code": "1"}); r.Status != 404 {
			t.Errorf("REST code with another account's key: %d %s", r.Status, r.Raw)
		}
		if r := s.as(other, "GET", "/api/sandboxes/"+id+"/code/contexts", nil); r.Status != 404 {
			t.Errorf("REST contexts with another account's key: %d %s", r.Status, r.Raw)
		}
		if a := s.mcpConnect(other).call(t, "run_code", map[string]any{"sandbox_id": id, "code": "1"}, ""); !a.IsError || !strings.Contains(a.Text, "not found") {
			t.Errorf("MCP run_code with another account's key: %+v", a)
		}
	})

	t.Run("e2b-port", func(t *testing.T) {
		securitytest.Attack(t, "code interpreter",
			"a caller sends E2B's POST /execute (port 49999) for a sandbox without its access token, with another sandbox's, and reads the user its kernel runs as",
			"401 without the token or with another's; with it, the code runs as the sandbox's default user (uid 1000), not root as E2B's kernels")
		type made struct {
			SandboxID       string `json:"sandboxID"`
			EnvdAccessToken string `json:"envdAccessToken"`
		}
		create := func() made {
			t.Helper()
			var m made
			r := s.as(k, "POST", "/v2/sandboxes", map[string]any{"templateID": "code-interpreter-v1", "timeout": 300})
			if r.Status != 201 || json.Unmarshal(r.Raw, &m) != nil || m.EnvdAccessToken == "" {
				t.Fatalf("E2B create: %d %s", r.Status, r.Raw)
			}
			t.Cleanup(func() { s.call("DELETE", "/sandboxes/"+m.SandboxID, map[string]string{"X-API-Key": k.Key}, nil) })
			return m
		}
		mine, another := create(), create()
		execute := func(token string) response {
			h := map[string]string{"E2b-Sandbox-Id": mine.SandboxID, "E2b-Sandbox-Port": "49999"}
			if token != "" {
				h["X-Access-Token"] = token
			}
			return s.call("POST", "/execute", h, map[string]any{"code": "import os\nos.getuid()"})
		}
		if r := execute(""); r.Status != 401 {
			t.Errorf("without the token: %d %s", r.Status, r.Raw)
		}
		if r := execute(another.EnvdAccessToken); r.Status != 401 {
			t.Errorf("with another sandbox's token: %d %s", r.Status, r.Raw)
		}
		if r := execute(mine.EnvdAccessToken); r.Status != 200 || !strings.Contains(string(r.Raw), `"text":"1000"`) {
			t.Errorf("with its token: %d %s", r.Status, r.Raw)
		}
	})

	t.Run("console", func(t *testing.T) {
		b := newConsoleBrowser(t, artifactsDir(t, "console-code"))
		b.signIn(s.base, k.Key)
		b.goTo("#sandbox/" + id)
		b.waitFor("the sandbox's page", `document.getElementById('view-sandbox').dataset.status === 'running'`, time.Minute)
		cell := func(code string) {
			t.Helper()
			n := b.eval(`document.querySelectorAll('#code-cells .code-cell').length`).(float64)
			b.fill("a cell", "#code-input", code)
			b.press("run it", "#code-run")
			b.waitFor("the cell's end", fmt.Sprintf(`(() => { const c = document.querySelectorAll('#code-cells .code-cell'); return c.length === %d && c[c.length - 1].dataset.done === 'true'; })()`, int(n)+1), 2*time.Minute)
		}
		last := `document.querySelector('#code-cells .code-cell:last-child')`
		cell("import matplotlib.pyplot as plt\nconsole_var = 5\nprint('from the console')\nplt.plot([1, 2])\nplt.show()")
		if out := b.text("#code-cells .code-cell:last-child .code-stream"); out != "from the console\n" {
			t.Errorf("the cell's stdout: %q", out)
		}
		b.waitFor("the chart drawn", last+`.querySelector('img.code-image').naturalWidth > 100`, 30*time.Second)
		cell("import pandas as pd\npd.DataFrame({'k': [console_var, 6]})")
		if got := b.eval(last + `.querySelector('.code-table').textContent`); got != "k56" {
			t.Errorf("the DataFrame's table: %q", got)
		}
		cell("1/0")
		if got := b.eval(last + `.dataset.error`); got != "ZeroDivisionError" || !strings.Contains(b.text("#code-cells .code-cell:last-child .code-error"), "division by zero") {
			t.Errorf("the exception: %v %q", got, b.text("#code-cells .code-cell:last-child .code-error"))
		}
		b.noOverflow("the notebook")
		b.shot("notebook")
		b.press("restart the kernel", "#code-restart")
		b.waitFor("the restart", `document.getElementById('code-status').textContent.includes('new kernel')`, time.Minute)
		cell("console_var")
		if got := b.eval(last + `.dataset.error`); got != "NameError" {
			t.Errorf("after the restart: %v", got)
		}
	})

	t.Run("e2b-sdk", func(t *testing.T) {
		node := findNode(t)
		dir, err := filepath.Abs("e2b")
		if err != nil {
			t.Fatal(err)
		}
		npmCI(t, node, dir)
		env := map[string]string{"SDK": "new", "E2B_API_URL": s.base, "E2B_SANDBOX_URL": s.base, "E2B_API_KEY": k.Key}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		if err := node.run(ctx, t, dir, env, node.bin, "--test", "--test-reporter=spec", "code/interpreter.test.js"); err != nil {
			t.Fatalf("node --test code/interpreter.test.js: %v", err)
		}
	})
}

// codeStreams checks the two streamed forms of POST .../code: Server-Sent
// Events and E2B's lines, each line as the code prints it.
func codeStreams(t *testing.T, s *server, k key, id string) {
	body := `{"code": "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.5)"}`
	for _, accept := range []string{"text/event-stream", "application/x-ndjson"} {
		req, _ := http.NewRequest("POST", s.base+"/api/sandboxes/"+id+"/code", strings.NewReader(body))
		req.Header.Set("x-api-key", k.Key)
		req.Header.Set("Accept", accept)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var arrivals []time.Time
		var kinds []string
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case accept == "text/event-stream" && strings.HasPrefix(line, "event: "):
				kinds = append(kinds, strings.TrimPrefix(line, "event: "))
				arrivals = append(arrivals, time.Now())
			case accept == "application/x-ndjson" && line != "":
				var l struct{ Type string }
				_ = json.Unmarshal([]byte(line), &l)
				kinds = append(kinds, l.Type)
				arrivals = append(arrivals, time.Now())
			}
		}
		resp.Body.Close()
		want := "number_of_executions stdout stdout stdout end"
		if accept == "application/x-ndjson" {
			want = "number_of_executions stdout stdout stdout end_of_execution"
		}
		if strings.Join(kinds, " ") != want || resp.Header.Get("Content-Type") != accept {
			t.Errorf("%s: %s, events %v", accept, resp.Header.Get("Content-Type"), kinds)
			continue
		}
		if gap := arrivals[3].Sub(arrivals[1]); gap < 700*time.Millisecond {
			t.Errorf("%s: the lines came together (%s apart), not as printed", accept, gap)
		}
	}
}
