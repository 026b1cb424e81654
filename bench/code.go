package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
)

// CodeOptions configure the code interpreter benchmark: sandboxes of the
// code-interpreter template through the REST API and through E2B's
// code-interpreter protocol, beside the bare runtime driving the same
// kernel with jupyter_client in a sandbox of the same root filesystem.
type CodeOptions struct {
	// Sandboxd is the sandboxd binary (serve and admin).
	Sandboxd string
	// ServeArgs are added to `serve` (--template code-interpreter, --runsc).
	ServeArgs []string
	// Rootfs is the template's root filesystem, which the bare runtime runs.
	Rootfs              string
	RunscPath, Platform string
	StateDir            string
	// Creates is how many sandboxes the create-to-first-result cases make
	// (default 5 each); N the samples of the warm cases (default 30).
	Creates, N int
	Progress   progress.Tracker
}

// CodeReport is what RunCode measured.
type CodeReport struct {
	Platform string     `json:"platform"`
	Cases    []ExecCase `json:"cases"`
}

// The cells each case runs.
const (
	codeFirst = "1 + 1"
	codeWarm  = "x = 1"
	codeChart = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()"
)

// RunCode runs the code interpreter benchmark.
func RunCode(ctx context.Context, o CodeOptions) (_ CodeReport, err error) {
	if o.Creates <= 0 {
		o.Creates = 5
	}
	if o.N <= 0 {
		o.N = 30
	}
	ph := startPhases(progress.Or(o.Progress), "bench code", 4)
	defer func() { ph.done(err) }()
	var rep CodeReport
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return rep, err
	}
	ph.next("starting the server")
	end, err := startExecServer(ctx, ExecOptions{Sandboxd: o.Sandboxd, ServeArgs: o.ServeArgs, Platform: o.Platform, StateDir: o.StateDir},
		codeTemplate)
	if err != nil {
		return rep, err
	}
	defer end.srv.stop()
	if o.Platform == "" {
		if o.Platform, err = end.srv.platform(ctx); err != nil {
			return rep, err
		}
	}
	rep.Platform = o.Platform

	ph.next(fmt.Sprintf("create to the first result, %d sandboxes each way", o.Creates))
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"REST: create, then `1 + 1` (the kernel starts)", func() error { return end.restFirstResult(ctx) }},
		{"E2B: create code-interpreter-v1, then runCode `1 + 1`", func() error { return end.e2bFirstResult(ctx) }},
	} {
		var ds []time.Duration
		for range o.Creates {
			start := time.Now()
			if err := c.run(); err != nil {
				return rep, fmt.Errorf("%s: %w", c.name, err)
			}
			ds = append(ds, time.Since(start))
		}
		rep.Cases = append(rep.Cases, ExecCase{Name: c.name, Latency: latency(ds, o.Creates)})
	}

	// A program that thinks before its first cell (an agent's model):
	// the kernel a create of code-interpreter-v1 starts is ready by then.
	var ds []time.Duration
	for range o.Creates {
		d, err := end.e2bFirstAfter(ctx, codeThink)
		if err != nil {
			return rep, fmt.Errorf("runCode after a pause: %w", err)
		}
		ds = append(ds, d)
	}
	rep.Cases = append(rep.Cases, ExecCase{Name: fmt.Sprintf("E2B: runCode `1 + 1` alone, %s after the create (its kernel started with it)", codeThink), Latency: latency(ds, o.Creates)})

	ph.next("cells on a warm context")
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"REST: a cell on a warm context (`x = 1`)", func() error { return end.restCell(ctx, codeWarm) }},
		{"E2B runCode: a cell on a warm context (`x = 1`)", func() error { return end.e2bCell(ctx, codeWarm) }},
		{"REST: a matplotlib chart (PNG and chart data)", func() error { return end.restCell(ctx, codeChart) }},
		{"E2B runCode: a matplotlib chart", func() error { return end.e2bCell(ctx, codeChart) }},
	} {
		l, err := sampled(o.N, c.run)
		if err != nil {
			return rep, fmt.Errorf("%s: %w", c.name, err)
		}
		rep.Cases = append(rep.Cases, ExecCase{Name: c.name, Latency: l})
	}

	ph.next("the bare runtime: jupyter_client and ipykernel in a runsc sandbox")
	bare, err := codeBaseline(ctx, o)
	if err != nil {
		return rep, err
	}
	rep.Cases = append(rep.Cases, bare...)
	return rep, nil
}

// restFirstResult creates a sandbox, runs the first cell and stops it.
func (e *execServerEnd) restFirstResult(ctx context.Context) error {
	var c created
	if _, err := e.srv.call(ctx, e.key, http.MethodPost, "/api/sandboxes", map[string]any{"timeout": 600_000}, &c); err != nil {
		return err
	}
	if len(c.Sandboxes) != 1 {
		return errors.New("the create answered no sandbox")
	}
	id := c.Sandboxes[0].SandboxID
	defer func() {
		_, _ = e.srv.call(context.WithoutCancel(ctx), e.key, http.MethodPost, "/api/sandboxes/"+id+"/stop", map[string]any{}, nil)
	}()
	return e.restCellIn(ctx, id, codeFirst, "2")
}

// e2bFirstResult creates a sandbox as the code-interpreter SDK does and
// runs the first cell through port 49999, then kills it.
func (e *execServerEnd) e2bFirstResult(ctx context.Context) error {
	other, kill, err := e.another(ctx)
	if err != nil {
		return err
	}
	defer kill()
	return other.e2bCellWant(ctx, codeFirst, "2")
}

// another creates a sandbox of e's template through E2B's API, on e's
// server and keys; kill kills it.
func (e *execServerEnd) another(ctx context.Context) (other *execServerEnd, kill func(), err error) {
	other = &execServerEnd{srv: e.srv, key: e.key, e2bKey: e.e2bKey, template: e.template}
	if err := other.create(ctx); err != nil {
		return nil, nil, err
	}
	return other, func() {
		_, _ = callAPI(context.WithoutCancel(ctx), e.srv.http, e.srv.base, e.e2bKey, http.MethodDelete, "/sandboxes/"+other.e2b, nil, nil, 1<<20)
	}, nil
}

// codeThink is the pause between a create and its first cell in the
// case of a program that thinks first.
const codeThink = 5 * time.Second

// e2bFirstAfter creates a sandbox as the code-interpreter SDK does, waits
// pause, and times its first runCode alone.
func (e *execServerEnd) e2bFirstAfter(ctx context.Context, pause time.Duration) (time.Duration, error) {
	other, kill, err := e.another(ctx)
	if err != nil {
		return 0, err
	}
	defer kill()
	select {
	case <-time.After(pause):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	start := time.Now()
	err = other.e2bCellWant(ctx, codeFirst, "2")
	return time.Since(start), err
}

func (e *execServerEnd) restCell(ctx context.Context, code string) error {
	return e.restCellIn(ctx, e.rest, code, "")
}

// restCellIn runs code through POST /api/sandboxes/{id}/code; a result
// text of want (when given) or an error fails it.
func (e *execServerEnd) restCellIn(ctx context.Context, id, code, want string) error {
	var out struct {
		Results []struct {
			Text string `json:"text"`
			PNG  string `json:"png"`
		} `json:"results"`
		Error *struct{ Name, Value string } `json:"error"`
	}
	if _, err := e.srv.call(ctx, e.key, http.MethodPost, "/api/sandboxes/"+id+"/code", map[string]any{"code": code}, &out); err != nil {
		return err
	}
	return checkCell(out.Error != nil, func() string { return out.Error.Name + ": " + out.Error.Value }, len(out.Results), func(i int) string { return out.Results[i].Text }, want, code)
}

func (e *execServerEnd) e2bCell(ctx context.Context, code string) error {
	return e.e2bCellWant(ctx, code, "")
}

// e2bCellWant runs code as the code-interpreter SDK's runCode does: POST
// /execute on E2B_SANDBOX_URL with E2b-Sandbox-Port 49999 and the access
// token, reading the lines to the end.
func (e *execServerEnd) e2bCellWant(ctx context.Context, code, want string) error {
	b, _ := json.Marshal(map[string]any{"code": code})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.base+"/execute", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("E2b-Sandbox-Id", e.e2b)
	req.Header.Set("E2b-Sandbox-Port", "49999")
	req.Header.Set("X-Access-Token", e.access)
	resp, err := e.srv.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return fmt.Errorf("POST /execute: HTTP %d: %s", resp.StatusCode, msg)
	}
	var texts []string
	var failed string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var l struct{ Type, Text, Name, Value string }
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return err
		}
		switch l.Type {
		case "result":
			texts = append(texts, l.Text)
		case "error":
			failed = l.Name + ": " + l.Value
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return checkCell(failed != "", func() string { return failed }, len(texts), func(i int) string { return texts[i] }, want, code)
}

// checkCell fails a cell that raised, or whose first result is not want.
func checkCell(failed bool, why func() string, results int, text func(int) string, want, code string) error {
	switch {
	case failed:
		return fmt.Errorf("%q raised %s", code, why())
	case want != "" && (results == 0 || text(0) != want):
		got := "no result"
		if results > 0 {
			got = text(0)
		}
		return fmt.Errorf("%q answered %q, want %q", code, got, want)
	}
	return nil
}

// codeBaselineScript drives a kernel as the shim does (jupyter_client,
// Unix sockets) and prints, as JSON, its own start (jupyter_client's
// import included) to the kernel's first result, and each warm cell's and
// chart's round trip, in ms.
const codeBaselineScript = `
import time
t = time.monotonic()
import json, sys
from jupyter_client.manager import KernelManager
n = int(sys.argv[1])
def run(kc, code):
    t = time.monotonic()
    mid = kc.execute(code)
    while True:
        m = kc.get_iopub_msg(timeout=120)
        if m["parent_header"].get("msg_id") == mid and m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            break
    return (time.monotonic() - t) * 1000
km = KernelManager(kernel_name="python3", transport="ipc")
km.connection_file = "/tmp/bench-kernel.json"
km.start_kernel(cwd="/tmp")
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=120)
run(kc, "1 + 1")
first = (time.monotonic() - t) * 1000
out = {"first": first, "warm": [run(kc, "x = 1") for _ in range(n)], "chart": [run(kc, sys.argv[2]) for _ in range(n)]}
km.shutdown_kernel(now=True)
print(json.dumps(out))
`

// codeBaseline is the bare runtime: a runsc sandbox of the same root
// filesystem, started and then the script run in it.
func codeBaseline(ctx context.Context, o CodeOptions) ([]ExecCase, error) {
	dir := filepath.Join(o.StateDir, "baseline")
	root := filepath.Join(dir, "runsc")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	defer gvisor.ReleaseRoot(root)
	if err := writeBundle(dir, o.Rootfs, []string{"/bin/sleep", "3600"}, tmpfsMount("/tmp")); err != nil {
		return nil, err
	}
	const cid = "bench-code"
	start := time.Now()
	if err := runscDetached(ctx, o.RunscPath, root, o.Platform, filepath.Join(dir, "detach.log"), "run", "--detach", "--bundle", dir, cid); err != nil {
		return nil, err
	}
	sandbox := time.Since(start)
	defer func() {
		_ = runscCmd(context.WithoutCancel(ctx), o.RunscPath, root, o.Platform, "delete", "--force", cid).Run()
	}()
	cmd := runscCmd(ctx, o.RunscPath, root, o.Platform, "exec", "--env", "HOME=/tmp", "--env", "MPLCONFIGDIR=/tmp/mpl",
		cid, "python3", "-c", codeBaselineScript, fmt.Sprint(o.N+warmup), codeChart)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("the baseline's script: %w: %s", err, tail(stderr.String(), 1000))
	}
	var got struct {
		First float64   `json:"first"`
		Warm  []float64 `json:"warm"`
		Chart []float64 `json:"chart"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &got); err != nil || len(got.Warm) != o.N+warmup {
		return nil, fmt.Errorf("the baseline's script printed %q: %v", tail(stdout.String(), 300), err)
	}
	ms := func(vs []float64) []time.Duration {
		var ds []time.Duration
		for _, v := range vs[warmup:] {
			ds = append(ds, time.Duration(v*float64(time.Millisecond)))
		}
		return ds
	}
	first := sandbox + time.Duration(got.First*float64(time.Millisecond))
	return []ExecCase{
		{Name: "bare: runsc run, then start a kernel and `1 + 1` (no API, no transfer)", Latency: latency([]time.Duration{first}, 1), Baseline: true},
		{Name: "bare: a cell on a warm kernel, jupyter_client in the sandbox", Latency: latency(ms(got.Warm), o.N), Baseline: true},
		{Name: "bare: a matplotlib chart, jupyter_client in the sandbox", Latency: latency(ms(got.Chart), o.N), Baseline: true},
	}, nil
}

// codeTemplate is the E2B template the code-interpreter SDK creates.
const codeTemplate = "code-interpreter-v1"
