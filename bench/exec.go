package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	pb "github.com/sandboxd/sandboxd/internal/guest/pb/process"
	"github.com/sandboxd/sandboxd/internal/guest/pb/process/processconnect"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
)

// ExecOptions configure the exec benchmark: commands in one running
// sandbox, one after another on a kept-alive connection, through the REST
// API and through E2B's agent protocol (what the e2b SDK's commands.run
// sends), and a command's output streamed; the bare runtime's figures for
// the same work are measured in the same run.
type ExecOptions struct {
	// Sandboxd is the sandboxd binary: the benchmark starts `serve` on a
	// scratch data dir and creates its account with `admin`.
	Sandboxd string
	// ServeArgs are added to `serve` (--template T, --runsc R).
	ServeArgs []string
	// Rootfs is the served template's root filesystem: the bare runtime
	// runs the same binaries. It needs bash (for its clock) and cat.
	Rootfs              string
	RunscPath, Platform string
	StateDir            string // scratch; created and removed
	// N is the samples of each latency (default 50), taken after 5 not
	// counted.
	N int
	// StreamMiB is the output streamed (default 256 MiB).
	StreamMiB int
	Progress  progress.Tracker
}

// ExecCase is one latency measured.
type ExecCase struct {
	Name    string  `json:"name"`
	Latency Latency `json:"latency"`
	// Baseline marks the bare runtime's figures.
	Baseline bool `json:"baseline,omitempty"`
}

// Throughput is output streamed: how much, how long, how fast.
type Throughput struct {
	Name     string  `json:"name"`
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	MBPerSec float64 `json:"mb_per_s"` // 10^6 bytes
	Baseline bool    `json:"baseline,omitempty"`
}

// ExecReport is what RunExec measured.
type ExecReport struct {
	Platform string       `json:"platform"`
	Cases    []ExecCase   `json:"cases"`
	Streams  []Throughput `json:"streams"`
}

// warmup samples are taken first and not counted: the first requests open
// connections and fill caches.
const warmup = 5

// execServerEnd is sandboxd's side of the benchmark: a server, a sandbox
// made through E2B's API (so both front ends reach it), and the keys.
type execServerEnd struct {
	srv               *ttiServer
	key, e2bKey       string
	rest, e2b, access string // the sandbox's ids and its agent token
	// template is the E2B template its sandboxes start from.
	template string
}

// RunExec runs the exec benchmark.
func RunExec(ctx context.Context, o ExecOptions) (_ ExecReport, err error) {
	if o.N <= 0 {
		o.N = 50
	}
	if o.StreamMiB <= 0 {
		o.StreamMiB = 256
	}
	ph := startPhases(progress.Or(o.Progress), "bench exec", 4)
	defer func() { ph.done(err) }()
	var rep ExecReport
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return rep, err
	}
	ph.next("starting the server and a sandbox")
	end, err := startExecServer(ctx, o, "base")
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

	ph.next("commands through the REST API and E2B's agent protocol")
	rest := func(body map[string]any, wantExit int) func() error {
		return func() error { return end.restExec(ctx, body, wantExit) }
	}
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"REST exec `true`", rest(map[string]any{"command": "true"}, 0)},
		{"REST exec of a command not found (an agent round trip, no process)", func() error { return end.restNotFound(ctx) }},
		{"REST exec `bash -l -c true` (a login shell)", rest(map[string]any{"command": "/bin/bash", "args": []string{"-l", "-c", "true"}}, 0)},
		{"E2B process.Start `/bin/bash -l -c true` (the SDK's commands.run)", func() error { return end.envdStart(ctx, "/bin/bash", "-l", "-c", "true") }},
		{"E2B process.Start `true`", func() error { return end.envdStart(ctx, "true") }},
	} {
		l, err := sampled(o.N, c.run)
		if err != nil {
			return rep, fmt.Errorf("%s: %w", c.name, err)
		}
		rep.Cases = append(rep.Cases, ExecCase{Name: c.name, Latency: l})
	}

	ph.next(fmt.Sprintf("%d MiB of output streamed", o.StreamMiB))
	st, err := end.stream(ctx, o.StreamMiB)
	if err != nil {
		return rep, err
	}
	rep.Streams = append(rep.Streams, st)

	ph.next("the bare runtime: runsc exec, a process started inside, output streamed")
	cases, bare, err := execBaseline(ctx, o)
	if err != nil {
		return rep, err
	}
	rep.Cases = append(rep.Cases, cases...)
	rep.Streams = append(rep.Streams, bare)
	return rep, nil
}

// sampled times run n times after the warm-up; the first failure ends it.
func sampled(n int, run func() error) (Latency, error) {
	var ds []time.Duration
	for i := range n + warmup {
		start := time.Now()
		if err := run(); err != nil {
			return Latency{}, err
		}
		if i >= warmup {
			ds = append(ds, time.Since(start))
		}
	}
	return latency(ds, n), nil
}

// startExecServer starts the server, its account and keys, and a sandbox
// of E2B's template.
func startExecServer(ctx context.Context, o ExecOptions, template string) (*execServerEnd, error) {
	srv, err := startServer(ctx, TTIOptions{Sandboxd: o.Sandboxd, ServeArgs: o.ServeArgs, Platform: o.Platform, StateDir: o.StateDir})
	if err != nil {
		return nil, err
	}
	end := &execServerEnd{srv: srv, template: template}
	data := []string{"--data-dir", filepath.Join(o.StateDir, "data")}
	account, err := adminAccount(ctx, o.Sandboxd, "bench-exec", data...)
	if err == nil {
		end.key, err = adminKeyOf(ctx, o.Sandboxd, account, "", data...)
	}
	if err == nil {
		end.e2bKey, err = adminKeyOf(ctx, o.Sandboxd, account, "e2b", data...)
	}
	if err == nil {
		err = end.create(ctx)
	}
	if err != nil {
		srv.stop()
		return nil, fmt.Errorf("%w\nthe server's log ends:\n%s", err, tail(srv.logs.String(), 3000))
	}
	return end, nil
}

// create makes the sandbox through E2B's API, which answers the token its
// agent protocol needs; sandboxd's API knows it by its own form of the id.
func (e *execServerEnd) create(ctx context.Context) error {
	var c struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	// callAPI's x-api-key is the header E2B's API reads too.
	code, err := callAPI(ctx, e.srv.http, e.srv.base, e.e2bKey, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": e.template, "timeout": 3600}, &c, 1<<20)
	if err != nil {
		return fmt.Errorf("E2B create: %w", err)
	}
	if code != http.StatusCreated {
		return fmt.Errorf("E2B create: HTTP %d, want 201", code)
	}
	if c.SandboxID == "" {
		return errors.New("E2B create answered no sandbox")
	}
	e.e2b, e.access = c.SandboxID, c.EnvdAccessToken
	e.rest = strings.Replace(c.SandboxID, "sbx-", "sbx_", 1)
	return nil
}

// restExec runs body's command through POST /api/sandboxes/{id}/exec.
func (e *execServerEnd) restExec(ctx context.Context, body map[string]any, wantExit int) error {
	var out struct {
		ExitCode int `json:"exitCode"`
	}
	if _, err := e.srv.call(ctx, e.key, http.MethodPost, "/api/sandboxes/"+e.rest+"/exec", body, &out); err != nil {
		return err
	}
	if out.ExitCode != wantExit {
		return fmt.Errorf("exit %d, want %d", out.ExitCode, wantExit)
	}
	return nil
}

// restNotFound asks for a command the sandbox does not have: the agent
// looks for it and starts nothing; the answer is an error by design.
func (e *execServerEnd) restNotFound(ctx context.Context) error {
	code, err := e.srv.call(ctx, e.key, http.MethodPost, "/api/sandboxes/"+e.rest+"/exec", map[string]any{"command": "/bin/sandboxd-bench-no-such-command"}, nil)
	if err == nil || code/100 != 4 || !strings.Contains(err.Error(), "command not found") {
		return fmt.Errorf("a command not found answered %d: %v", code, err)
	}
	return nil
}

// envdStart runs a command the way the e2b SDK does: process.Start on the
// agent port through sandboxd's E2B front end, following its events to
// the end.
func (e *execServerEnd) envdStart(ctx context.Context, cmd string, args ...string) error {
	client := processconnect.NewProcessClient(e.srv.http, e.srv.base)
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: cmd, Args: args}})
	h := req.Header()
	h.Set("E2b-Sandbox-Id", e.e2b)
	h.Set("E2b-Sandbox-Port", "49983")
	h.Set("X-Access-Token", e.access)
	h.Set("Authorization", "Basic dXNlcjo=") // "user:", the SDK's default user
	st, err := client.Start(ctx, req)
	if err != nil {
		return err
	}
	defer st.Close()
	for st.Receive() {
		if end := st.Msg().GetEvent().GetEnd(); end != nil {
			if end.GetExitCode() != 0 {
				return fmt.Errorf("exit %d", end.GetExitCode())
			}
			return nil
		}
	}
	if err := st.Err(); err != nil {
		return err
	}
	return errors.New("the stream ended without an end event")
}

// stream writes mib MiB of text to a file in the sandbox, then times `cat`
// of it streamed as Server-Sent Events to the end of its exit event.
func (e *execServerEnd) stream(ctx context.Context, mib int) (Throughput, error) {
	size := int64(mib) << 20
	if err := e.restExec(ctx, map[string]any{"command": "sh", "args": []string{"-c", streamFileScript(size)}}, 0); err != nil {
		return Throughput{}, fmt.Errorf("write the file to stream: %w", err)
	}
	b, _ := json.Marshal(map[string]any{"command": "cat", "args": []string{streamFile}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.base+"/api/sandboxes/"+e.rest+"/exec", bytes.NewReader(b))
	if err != nil {
		return Throughput{}, err
	}
	req.Header.Set("x-api-key", e.key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	start := time.Now()
	resp, err := e.srv.http.Do(req)
	if err != nil {
		return Throughput{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Throughput{}, fmt.Errorf("stream: HTTP %d", resp.StatusCode)
	}
	// Count the data the events carry: the JSON string of a line of
	// ASCII without quotes is the line itself plus its escaped newlines.
	var got int64
	exited := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<20), 8<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if bytes.HasPrefix(line, []byte(`data: {"data":"`)) {
			got += int64(len(line) - len(`data: {"data":"`) - len(`"}`) - bytes.Count(line, []byte(`\n`)))
		}
		if bytes.Equal(line, []byte("event: exit")) {
			exited = true
		}
	}
	secs := time.Since(start).Seconds()
	if err := sc.Err(); err != nil {
		return Throughput{}, err
	}
	if !exited || got != size {
		return Throughput{}, fmt.Errorf("stream: %d bytes of %d, exit event seen %v", got, size, exited)
	}
	return Throughput{Name: "REST exec `cat`, streamed as Server-Sent Events", Bytes: size, Seconds: secs, MBPerSec: float64(size) / secs / 1e6}, nil
}

// streamFile is where the streamed output is kept, in the sandbox and in
// the bare runtime's.
const streamFile = "/tmp/sandboxd-bench-stream"

// streamFileScript writes size bytes of lines of text to streamFile.
func streamFileScript(size int64) string {
	return "yes 'sandboxd streams a command output as it happens' | head -c " + strconv.FormatInt(size, 10) + " > " + streamFile
}

// execBaseline is the bare runtime doing the same in a sandbox of the same
// root filesystem: `runsc exec` of true; one fork, exec and wait of
// /bin/true timed inside by bash's own clock (what any process start in
// gVisor costs, whoever starts it); and `runsc exec cat` of the same file,
// its output a host pipe.
func execBaseline(ctx context.Context, o ExecOptions) ([]ExecCase, Throughput, error) {
	dir := filepath.Join(o.StateDir, "baseline")
	root := filepath.Join(dir, "runsc")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, Throughput{}, err
	}
	defer gvisor.ReleaseRoot(root)
	if err := writeBundle(dir, o.Rootfs, []string{"/bin/sleep", "3600"}, tmpfsMount("/tmp")); err != nil {
		return nil, Throughput{}, err
	}
	const cid = "bench-exec"
	runsc := func(args ...string) ([]byte, error) {
		out, err := runscCmd(ctx, o.RunscPath, root, o.Platform, args...).CombinedOutput()
		if err != nil {
			return out, fmt.Errorf("runsc %s: %w: %s", args[0], err, tail(string(out), 500))
		}
		return out, nil
	}
	if err := runscDetached(ctx, o.RunscPath, root, o.Platform, filepath.Join(dir, "detach.log"), "run", "--detach", "--bundle", dir, cid); err != nil {
		return nil, Throughput{}, err
	}
	defer func() { _, _ = runsc("delete", "--force", cid) }()

	exec, err := sampled(o.N, func() error { _, err := runsc("exec", cid, "/bin/true"); return err })
	if err != nil {
		return nil, Throughput{}, err
	}
	// One bash, n+warmup starts of /bin/true, each between two reads of
	// bash's clock (no process of its own): microseconds per start.
	loop := fmt.Sprintf(`for i in $(seq %d); do s=${EPOCHREALTIME/./}; /bin/true; e=${EPOCHREALTIME/./}; echo $((e-s)); done`, o.N+warmup)
	out, err := runsc("exec", cid, "/bin/bash", "-c", loop)
	if err != nil {
		return nil, Throughput{}, err
	}
	var starts []time.Duration
	for i, f := range strings.Fields(string(out)) {
		us, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, Throughput{}, fmt.Errorf("bash's start times: %q", tail(string(out), 200))
		}
		if i >= warmup {
			starts = append(starts, time.Duration(us)*time.Microsecond)
		}
	}
	cases := []ExecCase{
		{Name: "bare runsc exec /bin/true", Latency: exec, Baseline: true},
		{Name: "bare: one start of /bin/true by bash in the sandbox (fork, exec, wait)", Latency: latency(starts, o.N), Baseline: true},
	}

	size := int64(o.StreamMiB) << 20
	if _, err := runsc("exec", cid, "/bin/sh", "-c", streamFileScript(size)); err != nil {
		return nil, Throughput{}, err
	}
	cat := runscCmd(ctx, o.RunscPath, root, o.Platform, "exec", cid, "cat", streamFile)
	var count countingWriter
	cat.Stdout = &count
	start := time.Now()
	if err := cat.Run(); err != nil {
		return nil, Throughput{}, fmt.Errorf("runsc exec cat: %w", err)
	}
	secs := time.Since(start).Seconds()
	if count.n != size {
		return nil, Throughput{}, fmt.Errorf("runsc exec cat: %d bytes of %d", count.n, size)
	}
	return cases, Throughput{Name: "bare runsc exec `cat` (its output a host pipe)", Bytes: size, Seconds: secs, MBPerSec: float64(size) / secs / 1e6, Baseline: true}, nil
}

// countingWriter counts what is written to it.
type countingWriter struct{ n int64 }

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}
