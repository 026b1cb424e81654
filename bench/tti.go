package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
)

// TTIOptions configure the time-to-interactive benchmark: create a sandbox
// through the API, then run its first successful command, the way
// ComputeSDK's public benchmark measures hosted sandbox products.
type TTIOptions struct {
	// Sandboxd is the sandboxd binary: the benchmark starts `serve` on a
	// scratch data dir and creates its accounts with `admin`.
	Sandboxd string
	// ServeArgs are added to `serve` (e.g. --rootfs DIR, --template T).
	ServeArgs []string
	// Command is the first command (default `echo ok`).
	Command []string
	// N is the samples of the sequential and staggered modes (default
	// 10); Burst the sandboxes created at once (default 20).
	N, Burst int
	// Stagger is the gap between the staggered mode's creates (200 ms).
	Stagger time.Duration
	// Think is the pause of the after-run mode between a run's end and
	// the next create (default 1 s).
	Think time.Duration
	// SnapshotMiB is what the snapshot account's snapshot changed
	// (default 5 MiB of random bytes).
	SnapshotMiB int
	// Baseline: bare `runsc run --detach` + `runsc exec` of Rootfs (a
	// busybox tree) on Platform (empty: the platform serve probes, read from
	// its health answer); RunscPath empty means gvisor.DefaultRunsc.
	Rootfs, RunscPath, Platform string
	StateDir                    string // scratch; created and removed
	Progress                    progress.Tracker
	// CustomRootfs, when set, adds the custom template case
	// (tti_template.go): an image of this root filesystem, served on
	// loopback, built into a template through the API and measured in
	// the sequential, staggered and burst modes like the built-in image.
	// CustomImage names an image to build instead (its registry must be
	// reachable by the server). ServeArgs must then let the server use a
	// loopback registry (--templates-allow-private-registries).
	CustomRootfs, CustomImage string
	// TemplatePool is the server's --template-pool, for the report (""
	// when ServeArgs leave its default).
	TemplatePool string
}

// custom says whether the custom template case runs.
func (o TTIOptions) custom() bool { return o.CustomRootfs != "" || o.CustomImage != "" }

// Latency is a distribution of successful samples in milliseconds, and
// how many of the samples succeeded.
type Latency struct {
	N           int     `json:"n"`
	OK          int     `json:"ok"`
	SuccessRate float64 `json:"success_rate"`
	P50         float64 `json:"p50_ms"`
	P95         float64 `json:"p95_ms"`
	P99         float64 `json:"p99_ms"`
	Min         float64 `json:"min_ms"`
	Max         float64 `json:"max_ms"`
	// Samples are the successful samples, in the order they were taken.
	Samples []float64 `json:"samples_ms,omitempty"`
}

func latency(ds []time.Duration, n int) Latency {
	l := Latency{N: n, OK: len(ds)}
	if n > 0 {
		l.SuccessRate = round(float64(len(ds)) / float64(n))
	}
	if len(ds) == 0 {
		return l
	}
	q := quantiles(ds)
	l.P50, l.P95, l.P99, l.Min, l.Max = q(0.5), q(0.95), q(0.99), q(0), q(1)
	l.Samples = samples(ds)
	return l
}

// TTIResult is one mode for one kind of account.
type TTIResult struct {
	Account string  `json:"account"` // "fresh", "snapshot", or "custom-template" (its creates name the template)
	Mode    string  `json:"mode"`    // "sequential", "staggered", "burst", "burst-again" (a second burst, once the warm pool grew), "after-run", or "first" (a custom template's first create)
	Latency Latency `json:"latency"`
	// Create is the create's own answer (the sandbox is running then):
	// create-to-running, next to the bare runtime's run --detach.
	Create Latency  `json:"create"`
	Errors []string `json:"errors,omitempty"` // the first few failures
}

// TTIReport is what RunTTI measured.
type TTIReport struct {
	Command  []string    `json:"command"`
	Results  []TTIResult `json:"results"`
	Baseline Latency     `json:"baseline_runsc_run_detach_exec"`
	// BaselineRun is the baseline's `runsc run --detach` alone.
	BaselineRun Latency `json:"baseline_runsc_run_detach"`
	// BaselineBurst is the baseline's Burst starts and execs at once.
	BaselineBurst Latency `json:"baseline_runsc_run_detach_exec_burst"`
	Platform      string  `json:"platform"`
	// Template is the custom template measured (the results of account
	// "custom-template"); nil when the case did not run.
	Template *TTITemplate `json:"custom_template,omitempty"`
}

// RunTTI runs the time-to-interactive benchmark: a server of its own, a
// fresh account and one with a snapshot, each in the three modes, then the
// bare runtime's baseline in the same run.
func RunTTI(ctx context.Context, o TTIOptions) (_ TTIReport, err error) {
	if o.N <= 0 {
		o.N = 10
	}
	if o.Burst <= 0 {
		o.Burst = 20
	}
	if o.Stagger <= 0 {
		o.Stagger = 200 * time.Millisecond
	}
	if o.Think <= 0 {
		o.Think = time.Second
	}
	if o.SnapshotMiB <= 0 {
		o.SnapshotMiB = 5
	}
	if len(o.Command) == 0 {
		o.Command = []string{"echo", "ok"}
	}
	// The snapshot, seven modes and the baseline; the custom template's
	// build and three modes.
	phases := 9
	if o.custom() {
		phases += 4
	}
	ph := startPhases(progress.Or(o.Progress), "bench tti", phases)
	defer func() { ph.done(err) }()
	rep := TTIReport{Command: o.Command}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return rep, err
	}
	srv, err := startServer(ctx, o)
	if err != nil {
		return rep, err
	}
	defer srv.stop()
	if o.Platform == "" {
		// The platform serve chose: the baseline runs on the same one.
		if o.Platform, err = srv.platform(ctx); err != nil {
			return rep, err
		}
	}
	rep.Platform = o.Platform
	accounts := map[string]string{}
	for _, name := range []string{"fresh", "snapshot"} {
		key, err := srv.account(ctx, "tti-"+name)
		if err != nil {
			return rep, err
		}
		accounts[name] = key
	}
	ph.next(fmt.Sprintf("giving the snapshot account a snapshot (%d MiB changed)", o.SnapshotMiB))
	if err := srv.snapshot(ctx, accounts["snapshot"], o.SnapshotMiB); err != nil {
		return rep, err
	}
	for _, account := range []string{"fresh", "snapshot"} {
		modes := []string{"sequential", "staggered", "burst"}
		if account == "fresh" {
			modes = append(modes, "burst-again")
		} else {
			modes = append(modes, "after-run")
		}
		for _, mode := range modes {
			ph.next(account + " account, " + mode)
			if mode == "burst-again" {
				// The warm pool grew to the last minute's creates (up
				// to serve's --warm-pool-max): the second burst finds
				// what the first asked for, once it is started.
				// A runtime whose pool does not grow (the microVM's) has
				// nothing to measure here: the mode says why.
				if err := srv.waitPool(ctx, "builtin", min(o.Burst, defaultWarmPoolMax), 2*time.Minute); err != nil {
					rep.Results = append(rep.Results, TTIResult{Account: account, Mode: mode, Errors: []string{err.Error()}})
					continue
				}
			}
			if account == "fresh" {
				// A fresh account every time: the first sandbox of an
				// account is what is measured, not its tenth.
				key, err := srv.account(ctx, "tti-fresh-"+mode)
				if err != nil {
					return rep, err
				}
				accounts["fresh"] = key
			}
			rep.Results = append(rep.Results, srv.mode(ctx, accounts[account], account, mode, o, map[string]any{}))
		}
	}
	if o.custom() {
		// One account owns the template (it is private) and makes every
		// create from it: a template's sandbox never takes or restores
		// the account's snapshot, so its creates are alike.
		ph.next("building the custom template")
		key, err := srv.account(ctx, "tti-custom-template")
		if err != nil {
			return rep, err
		}
		tt, stopRegistry, err := srv.buildCustomTemplate(ctx, key, o)
		defer stopRegistry()
		if err != nil {
			return rep, err
		}
		rep.Template = &tt
		// Its first create starts cold (nothing of it was started
		// ahead) and gives it a pool; the modes run once the pool is
		// full, as the built-in's run on a warm pool filled at start.
		first := srv.mode(ctx, key, "custom-template", "first", o, map[string]any{"template": customTemplateName})
		rep.Results = append(rep.Results, first)
		if len(first.Errors) > 0 {
			return rep, fmt.Errorf("the custom template's first create: %s", first.Errors[0])
		}
		if err := srv.waitPoolReady(ctx, o.templatePoolFill()); err != nil {
			return rep, err
		}
		for _, mode := range []string{"sequential", "staggered", "burst"} {
			ph.next("custom template, " + mode)
			rep.Results = append(rep.Results, srv.mode(ctx, key, "custom-template", mode, o, map[string]any{"template": customTemplateName}))
		}
	}
	ph.next(fmt.Sprintf("bare runsc run --detach + runsc exec, one after another and %d at once", o.Burst))
	if rep.Baseline, rep.BaselineRun, rep.BaselineBurst, err = ttiBaseline(ctx, o); err != nil {
		return rep, err
	}
	return rep, nil
}

// defaultWarmPoolMax is serve's --warm-pool-max, which the benchmark's
// server keeps: what its warm pool grows to after a burst.
const defaultWarmPoolMax = 16

// ttiServer is a `sandboxd serve` the benchmark started.
type ttiServer struct {
	o       TTIOptions
	base    string
	metrics string // base URL of its metrics listener
	cmd     *exec.Cmd
	logs    *bytes.Buffer
	http    *http.Client
}

func startServer(ctx context.Context, o TTIOptions) (*ttiServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		ln.Close()
		return nil, err
	}
	addr, maddr := ln.Addr().String(), mln.Addr().String()
	ln.Close()
	mln.Close()
	s := &ttiServer{o: o, base: "http://" + addr, metrics: "http://" + maddr, logs: &bytes.Buffer{}, http: &http.Client{Timeout: 5 * time.Minute}}
	args := []string{"serve", "--data-dir", filepath.Join(o.StateDir, "data"), "--listen", addr, "--metrics-addr", maddr,
		"--max-sandboxes-per-account", "0", "--setup-on-first-use=false"}
	if o.Platform != "" {
		args = append(args, "--gvisor-platform", o.Platform)
	}
	args = append(args, o.ServeArgs...)
	s.cmd = exec.Command(o.Sandboxd, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start sandboxd: %w", err)
	}
	deadline := time.Now().Add(10 * time.Minute) // a first start may build the image
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if resp, err := http.Get(s.base + "/api/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if s.cmd.ProcessState != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.stop()
	return nil, fmt.Errorf("sandboxd did not become healthy:\n%s", tail(s.logs.String(), 4000))
}

// platform is the gVisor platform the server runs on, from the runtime
// its health answer names ("gvisor systrap, runsc ...").
func (s *ttiServer) platform(ctx context.Context) (string, error) {
	var h struct {
		Runtime string `json:"runtime"`
	}
	if _, err := s.call(ctx, "", http.MethodGet, "/api/health", nil, &h); err != nil {
		return "", err
	}
	f := strings.Fields(strings.ReplaceAll(h.Runtime, ",", " "))
	if len(f) < 2 || f[0] != "gvisor" {
		return "", fmt.Errorf("the server's runtime %q names no gVisor platform; pass --gvisor-platform", h.Runtime)
	}
	return f[1], nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (s *ttiServer) stop() {
	if s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

// account creates an account and returns an API key for it.
func (s *ttiServer) account(ctx context.Context, name string) (string, error) {
	return adminKey(ctx, s.o.Sandboxd, name, "--data-dir", filepath.Join(s.o.StateDir, "data"))
}

// call sends a JSON request with key and decodes the answer.
func (s *ttiServer) call(ctx context.Context, key, method, path string, body any, out any) (int, error) {
	return callAPI(ctx, s.http, s.base, key, method, path, body, out, 4<<20)
}

type created struct {
	Sandboxes []struct {
		SandboxID string `json:"sandboxId"`
		RunID     string `json:"runId"`
	} `json:"sandboxes"`
}

// snapshot gives the account a snapshot: a run that writes mib MiB of
// random bytes, whose end records the sandbox's filesystem.
func (s *ttiServer) snapshot(ctx context.Context, key string, mib int) error {
	return s.runToSnapshot(ctx, key, fmt.Sprintf("head -c %d /dev/urandom > /workspace/tti.bin", mib<<20))
}

// runToSnapshot runs script in a new sandbox of the account and waits for
// the run's end, which records the sandbox's filesystem as the account's
// snapshot; then it stops the sandbox.
func (s *ttiServer) runToSnapshot(ctx context.Context, key, script string) error {
	var c created
	body := map[string]any{"command": "sh", "args": []string{"-c", script}}
	if _, err := s.call(ctx, key, http.MethodPost, "/api/sandboxes", body, &c); err != nil {
		return err
	}
	if len(c.Sandboxes) == 0 || c.Sandboxes[0].RunID == "" {
		return errors.New("create with a command answered no run")
	}
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		var runs struct {
			Runs []struct {
				Status string         `json:"status"`
				Output map[string]any `json:"output"`
			} `json:"runs"`
		}
		if _, err := s.call(ctx, key, http.MethodGet, "/api/tasks/runs?runId="+c.Sandboxes[0].RunID, nil, &runs); err != nil {
			return err
		}
		if len(runs.Runs) == 1 && runs.Runs[0].Status != "QUEUED" && runs.Runs[0].Status != "EXECUTING" {
			if runs.Runs[0].Status != "COMPLETED" || runs.Runs[0].Output["snapshotId"] == nil {
				return fmt.Errorf("the snapshot run ended %s without a snapshot: %v", runs.Runs[0].Status, runs.Runs[0].Output)
			}
			_, _ = s.call(ctx, key, http.MethodPost, "/api/sandboxes/"+c.Sandboxes[0].SandboxID+"/stop", map[string]any{}, nil)
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return errors.New("the snapshot run did not end in 5 minutes")
}

// sample creates a sandbox (the create's body is req) and runs the
// first command until it succeeds: the time from the create's request to
// the command's answer, the time to the create's own answer, and the
// sandbox (to stop afterwards).
func (s *ttiServer) sample(ctx context.Context, key string, req map[string]any) (tti, create time.Duration, id string, err error) {
	start := time.Now()
	var c created
	if _, err := s.call(ctx, key, http.MethodPost, "/api/sandboxes", req, &c); err != nil {
		return 0, 0, "", err
	}
	create = time.Since(start)
	if len(c.Sandboxes) == 0 {
		return 0, 0, "", errors.New("create answered no sandbox")
	}
	id = c.Sandboxes[0].SandboxID
	body := map[string]any{"command": s.o.Command[0], "args": s.o.Command[1:]}
	var lastErr error
	for time.Since(start) < time.Minute {
		var out struct {
			ExitCode int `json:"exitCode"`
		}
		_, err := s.call(ctx, key, http.MethodPost, "/api/sandboxes/"+id+"/exec", body, &out)
		if err == nil && out.ExitCode == 0 {
			return time.Since(start), create, id, nil
		}
		if err == nil {
			err = fmt.Errorf("first command exited %d", out.ExitCode)
		}
		lastErr = err
		time.Sleep(20 * time.Millisecond)
	}
	return 0, create, id, fmt.Errorf("no successful command within a minute: %w", lastErr)
}

// mode runs one mode's samples, each a create of body req, and stops
// their sandboxes afterwards.
func (s *ttiServer) mode(ctx context.Context, key, account, mode string, o TTIOptions, req map[string]any) TTIResult {
	n := o.N
	switch mode {
	case "burst", "burst-again":
		n = o.Burst
	case "first":
		n = 1
	}
	var (
		mu   sync.Mutex
		ds   []time.Duration
		cs   []time.Duration
		ids  []string
		errs []string
		wg   sync.WaitGroup
	)
	one := func() {
		d, c, id, err := s.sample(ctx, key, req)
		mu.Lock()
		defer mu.Unlock()
		if id != "" {
			ids = append(ids, id)
			cs = append(cs, c)
		}
		if err != nil {
			if len(errs) < 5 {
				errs = append(errs, err.Error())
			}
			return
		}
		ds = append(ds, d)
	}
	for i := range n {
		switch mode {
		case "sequential", "first":
			one()
		case "after-run":
			// The account's main flow: a run ends (its snapshot taken),
			// the user reads it, then the next sandbox.
			if err := s.runToSnapshot(ctx, key, fmt.Sprintf("echo %d >> /workspace/tti.log", i)); err != nil {
				mu.Lock()
				if len(errs) < 5 {
					errs = append(errs, err.Error())
				}
				mu.Unlock()
				continue
			}
			time.Sleep(o.Think)
			one()
		case "staggered":
			if i > 0 {
				time.Sleep(o.Stagger)
			}
			wg.Add(1)
			go func() { defer wg.Done(); one() }()
		default:
			wg.Add(1)
			go func() { defer wg.Done(); one() }()
		}
	}
	wg.Wait()
	for _, id := range ids {
		_, _ = s.call(ctx, key, http.MethodPost, "/api/sandboxes/"+id+"/stop", map[string]any{}, nil)
	}
	return TTIResult{Account: account, Mode: mode, Latency: latency(ds, n), Create: latency(cs, n), Errors: errs}
}

// ttiBaseline is the bare runtime doing the same: `runsc run --detach`
// of a sleeping busybox bundle, then `runsc exec` of the first command,
// sequentially; the run --detach alone; and o.Burst of them at once.
func ttiBaseline(ctx context.Context, o TTIOptions) (tti, run, burst Latency, err error) {
	dir := filepath.Join(o.StateDir, "baseline")
	root := filepath.Join(dir, "runsc")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return tti, run, burst, err
	}
	defer gvisor.ReleaseRoot(root)
	if err := writeBundle(dir, o.Rootfs, []string{"/bin/sleep", "1000"}); err != nil {
		return tti, run, burst, err
	}
	// one starts container cid and runs the command in it: the whole
	// time and the start's alone.
	one := func(cid string) (d, r time.Duration, err error) {
		start := time.Now()
		err = runscDetached(ctx, o.RunscPath, root, o.Platform, filepath.Join(dir, cid+".log"), "run", "--detach", "--bundle", dir, cid)
		r = time.Since(start)
		if err == nil {
			var out []byte
			out, err = runscCmd(ctx, o.RunscPath, root, o.Platform, "exec", cid, "/bin/echo", "ok").CombinedOutput()
			if err == nil && strings.TrimSpace(string(out)) != "ok" {
				err = fmt.Errorf("runsc exec printed %q", out)
			} else if err != nil {
				err = fmt.Errorf("runsc exec: %w: %s", err, out)
			}
		}
		d = time.Since(start)
		if err != nil {
			err = fmt.Errorf("runsc baseline: %w", err)
		}
		return d, r, err
	}
	var ds, rs []time.Duration
	for i := range o.N {
		cid := fmt.Sprintf("tti-%d", i)
		d, r, err := one(cid)
		_ = runscCmd(ctx, o.RunscPath, root, o.Platform, "delete", "--force", cid).Run()
		if err != nil {
			return tti, run, burst, err
		}
		ds, rs = append(ds, d), append(rs, r)
	}
	var (
		mu sync.Mutex
		bs []time.Duration
		wg sync.WaitGroup
	)
	for i := range o.Burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A start that fails counts as one not ok, as sandboxd's do.
			if d, _, err := one(fmt.Sprintf("tti-burst-%d", i)); err == nil {
				mu.Lock()
				bs = append(bs, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for i := range o.Burst {
		_ = runscCmd(ctx, o.RunscPath, root, o.Platform, "delete", "--force", fmt.Sprintf("tti-burst-%d", i)).Run()
	}
	return latency(ds, o.N), latency(rs, o.N), latency(bs, o.Burst), nil
}
