package templates_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// fakeHost starts build sandboxes on runtimefake and records what each
// was started with and which commands ran in it.
type fakeHost struct {
	rt *runtimefake.Runtime
	mu sync.Mutex
	// starts are the layer ids of each build sandbox; runs the RUN
	// requests, in order.
	starts  [][]string
	nets    []netpol.Policy
	runs    []runtime.ExecRequest
	stopped int
}

func newFakeHost() *fakeHost {
	h := &fakeHost{rt: runtimefake.New()}
	h.rt.SetExec(func(ctx context.Context, sb *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		if req.Cmd[0] != "/bin/sh" {
			return runtime.ExecResult{}, nil // mkdir of a WORKDIR
		}
		h.mu.Lock()
		h.runs = append(h.runs, req)
		h.mu.Unlock()
		cmd := req.Cmd[2]
		switch {
		case strings.Contains(cmd, "sleep"):
			<-ctx.Done()
			return runtime.ExecResult{}, nil
		case strings.Contains(cmd, "never-ready"):
			return runtime.ExecResult{ExitCode: 1}, nil
		case strings.Contains(cmd, "exit 3"):
			fmt.Fprintln(req.Stderr, "about to fail")
			return runtime.ExecResult{ExitCode: 3}, nil
		}
		// Each command leaves a file of its own, so its layer differs.
		if err := sb.WriteFile(ctx, "/out/"+fmt.Sprint(len(cmd)), strings.NewReader(cmd), 0o644); err != nil {
			return runtime.ExecResult{}, err
		}
		fmt.Fprintf(req.Stdout, "ran %s\n", cmd)
		return runtime.ExecResult{}, nil
	})
	return h
}

func (h *fakeHost) StartBuildSandbox(ctx context.Context, req templates.BuildSandbox) (runtime.Sandbox, func(context.Context), error) {
	var ids []string
	for _, l := range req.Layers {
		ids = append(ids, l.ID)
	}
	h.mu.Lock()
	h.starts = append(h.starts, ids)
	h.nets = append(h.nets, req.Network)
	h.mu.Unlock()
	rsb, err := h.rt.Create(ctx, runtime.Spec{ID: req.ID, BaseDir: req.BaseDir, BaseImage: req.BaseImage, Layers: req.Layers})
	if err != nil {
		return nil, nil, err
	}
	return rsb, func(ctx context.Context) {
		rsb.Destroy(ctx)
		h.mu.Lock()
		h.stopped++
		h.mu.Unlock()
	}, nil
}

func (h *fakeHost) commands() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.runs {
		out = append(out, r.Cmd[2])
	}
	return out
}

// stepsService is a templates service that runs steps on host, with a
// local blob store, on f's store and cache.
func stepsService(t *testing.T, f *fixture, host *fakeHost, stepTimeout time.Duration) *templates.Service {
	t.Helper()
	blobs, err := blob.NewLocal(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	jc, err := jobs.New(t.Context(), f.st, jobs.Config{NodeID: "here"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(jc.Close)
	svc, err := templates.New(templates.Config{Store: f.st, Jobs: jc, NodeID: "here", Dir: f.dir, AllowPrivate: true,
		Blobs: blobs, StepTimeout: stepTimeout, Host: host})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func steps(t *testing.T, s ...string) json.RawMessage {
	t.Helper()
	return json.RawMessage("[" + strings.Join(s, ",") + "]")
}

func build(t *testing.T, f *fixture, svc *templates.Service, req templates.BuildRequest) store.Template {
	t.Helper()
	tpl, err := svc.Build(t.Context(), f.alice, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Run(t.Context(), tpl.ID); err != nil {
		t.Fatal(err)
	}
	got, err := f.st.GetTemplate(t.Context(), tpl.ID)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestBuildWithSteps(t *testing.T) {
	f := newFixture(t)
	host := newFakeHost()
	svc := stepsService(t, f, host, 0)
	ctx := t.Context()
	ref := f.push(t, "tools/base:1", v1.Config{Env: []string{"PATH=/bin", "X=0"}}, map[string]string{"etc/hostname": "x\n"})

	got := build(t, f, svc, templates.BuildRequest{Name: "app:v1", Image: ref, Steps: steps(t,
		`{"type":"ENV","args":["X","1","Y","2"]}`,
		`{"type":"ARG","args":["A","a"]}`,
		`{"type":"RUN","args":["echo hi > /opt/hi && echo built"]}`,
		`{"type":"USER","args":["nobody"]}`,
		`{"type":"RUN","args":["id -un","root"]}`,
		`{"type":"WORKDIR","args":["/opt"]}`,
		`{"type":"WORKDIR","args":["app"]}`,
	)})
	if got.Status != store.TemplateReady {
		t.Fatalf("build: %s %s\n%s", got.Status, got.FailureReason, got.Log)
	}
	// The RUNs: sh -c, with ENV and ARG, as the step's user or the
	// current one, in the current directory, on the base image.
	host.mu.Lock()
	runs := slices.Clone(host.runs)
	starts := slices.Clone(host.starts)
	nets := slices.Clone(host.nets)
	host.mu.Unlock()
	if len(runs) != 2 || runs[0].Cmd[0] != "/bin/sh" || runs[0].Cmd[1] != "-c" || runs[0].Cmd[2] != "echo hi > /opt/hi && echo built" {
		t.Fatalf("runs %+v", runs)
	}
	if env := strings.Join(runs[0].Env, " "); env != "A=a PATH=/bin X=1 Y=2" || runs[0].Cwd != "/" || runs[0].User != "" {
		t.Fatalf("first RUN: env %q cwd %q user %q", env, runs[0].Cwd, runs[0].User)
	}
	if runs[1].User != "" { // "root" for this step only
		t.Fatalf("second RUN as %q, want root", runs[1].User)
	}
	// A sandbox per layer: the RUNs' and the WORKDIRs' after them, each
	// from the layers before it; the build network egress by default.
	if len(starts) != 3 || len(starts[0]) != 0 || len(starts[1]) != 1 || len(starts[2]) != 2 || host.stopped != 3 {
		t.Fatalf("build sandboxes from layers %v, %d stopped", starts, host.stopped)
	}
	if nets[0].Mode != netpol.ModeEgress {
		t.Fatalf("build network %+v", nets[0])
	}
	var layers []string
	if err := json.Unmarshal([]byte(got.Layers), &layers); err != nil || len(layers) != 3 || "sha256:"+layers[1] != starts[2][1] {
		t.Fatalf("layers %q (%v); sandboxes %v", got.Layers, err, starts)
	}
	for _, want := range []string{"step 1/7: ENV X Y", "step 3/7: RUN echo hi", "ran echo hi > /opt/hi && echo built", "step 3/7: layer ", "step 7/7: WORKDIR /opt/app", "ready: "} {
		if !strings.Contains(got.Log, want) {
			t.Fatalf("log lacks %q:\n%s", want, got.Log)
		}
	}
	// The config follows ENV, WORKDIR and USER (ARG is the build's).
	img, err := svc.Find(ctx, f.alice.AccountID, "app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(img.Config.Env, " ") != "PATH=/bin X=1 Y=2" || img.Config.WorkingDir != "/opt/app" || img.Config.User != "nobody" || len(img.Layers) != 3 {
		t.Fatalf("image %+v", img)
	}
	opened, release, err := img.OpenLayers(ctx)
	if err != nil || len(opened) != 3 {
		t.Fatalf("open layers: %d %v", len(opened), err)
	}
	for _, l := range opened {
		io.Copy(io.Discard, l.R)
	}
	release()
}

func TestBuildStepsCache(t *testing.T) {
	f := newFixture(t)
	host := newFakeHost()
	svc := stepsService(t, f, host, 0)
	ref := f.push(t, "tools/base:1", v1.Config{}, map[string]string{"etc/hostname": "x\n"})
	first := []string{`{"type":"ENV","args":["X","1"]}`, `{"type":"RUN","args":["make one"]}`, `{"type":"RUN","args":["make two"]}`}

	v1t := build(t, f, svc, templates.BuildRequest{Name: "app:v1", Image: ref, Steps: steps(t, first...)})
	if v1t.Status != store.TemplateReady || strings.Join(host.commands(), ";") != "make one;make two" {
		t.Fatalf("first build: %s %q", v1t.Status, host.commands())
	}

	// Only the last step changed: only it runs, over the first's layer.
	host.runs = nil
	v2t := build(t, f, svc, templates.BuildRequest{Name: "app:v2", Image: ref, Steps: steps(t, first[0], first[1], `{"type":"RUN","args":["make three"]}`)})
	if v2t.Status != store.TemplateReady || strings.Join(host.commands(), ";") != "make three" {
		t.Fatalf("rebuild ran %q (%s)\n%s", host.commands(), v2t.Status, v2t.Log)
	}
	if !strings.Contains(v2t.Log, "step 2/3: cached") || strings.Contains(v2t.Log, "step 3/3: cached") {
		t.Fatalf("rebuild log:\n%s", v2t.Log)
	}
	var l1, l2 []string
	json.Unmarshal([]byte(v1t.Layers), &l1)
	json.Unmarshal([]byte(v2t.Layers), &l2)
	if len(l2) != 2 || l2[0] != l1[0] || l2[1] == l1[1] {
		t.Fatalf("layers %v then %v", l1, l2)
	}

	// The same steps again: nothing runs. An earlier step changed (the
	// ENV): everything after it runs.
	host.runs = nil
	if got := build(t, f, svc, templates.BuildRequest{Name: "app:v3", Image: ref, Steps: steps(t, first...)}); got.Layers != v1t.Layers || len(host.commands()) != 0 {
		t.Fatalf("same steps: layers %s (want %s), ran %q", got.Layers, v1t.Layers, host.commands())
	}
	build(t, f, svc, templates.BuildRequest{Name: "app:v4", Image: ref, Steps: steps(t, `{"type":"ENV","args":["X","2"]}`, first[1], first[2])})
	if strings.Join(host.commands(), ";") != "make one;make two" {
		t.Fatalf("changed ENV ran %q", host.commands())
	}

	// force reruns its step and the ones after it.
	host.runs = nil
	build(t, f, svc, templates.BuildRequest{Name: "app:v5", Image: ref, Steps: steps(t, first[0], `{"type":"RUN","args":["make one"],"force":true}`, first[2])})
	if strings.Join(host.commands(), ";") != "make one;make two" {
		t.Fatalf("forced ran %q", host.commands())
	}

	// Another account's cache is its own.
	host.runs = nil
	tpl, err := svc.Build(t.Context(), f.bob, templates.BuildRequest{Name: "app:v1", Image: ref, Steps: steps(t, first...)})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Run(t.Context(), tpl.ID); err != nil {
		t.Fatal(err)
	}
	if strings.Join(host.commands(), ";") != "make one;make two" {
		t.Fatalf("another account's build ran %q", host.commands())
	}
}

func TestBuildStepsFail(t *testing.T) {
	f := newFixture(t)
	host := newFakeHost()
	svc := stepsService(t, f, host, 200*time.Millisecond)
	ref := f.push(t, "tools/base:1", v1.Config{}, map[string]string{"etc/hostname": "x\n"})

	got := build(t, f, svc, templates.BuildRequest{Name: "bad:v1", Image: ref, Steps: steps(t,
		`{"type":"RUN","args":["true"]}`, `{"type":"RUN","args":["exit 3"]}`, `{"type":"RUN","args":["never"]}`)})
	if got.Status != store.TemplateFailed || got.FailureReason != "step 2 (RUN exit 3) failed with exit code 3" || !strings.Contains(got.Log, "about to fail") {
		t.Fatalf("failed build: %s %q\n%s", got.Status, got.FailureReason, got.Log)
	}
	if slices.Contains(host.commands(), "never") || host.stopped != 2 {
		t.Fatalf("ran %q, stopped %d", host.commands(), host.stopped)
	}
	if _, err := svc.Find(t.Context(), f.alice.AccountID, "bad:v1"); err == nil || !strings.Contains(err.Error(), "step 2 (RUN") {
		t.Fatalf("find a failed build: %v", err)
	}

	got = build(t, f, svc, templates.BuildRequest{Name: "slow:v1", Image: ref, Steps: steps(t, `{"type":"RUN","args":["sleep 1000"]}`)})
	if got.Status != store.TemplateFailed || got.FailureReason != "step 1 (RUN) took longer than 200ms" {
		t.Fatalf("slow build: %s %q", got.Status, got.FailureReason)
	}

	// A Dockerfile: its FROM is the base, its steps run the same way.
	got = build(t, f, svc, templates.BuildRequest{Name: "df:v1", Dockerfile: "FROM " + ref + "\nENV X=1\nRUN exit 3\n"})
	if got.Status != store.TemplateFailed || got.Source != ref || got.FailureReason != "step 2 (RUN exit 3) failed with exit code 3" {
		t.Fatalf("dockerfile build: %s %s %q", got.Status, got.Source, got.FailureReason)
	}
}

func TestBuildStartAndReadyCommands(t *testing.T) {
	f := newFixture(t)
	host := newFakeHost()
	svc := stepsService(t, f, host, 300*time.Millisecond)
	ref := f.push(t, "tools/base:1", v1.Config{}, map[string]string{"etc/hostname": "x\n"})

	// Checked at the end of the build, over the steps' layers, and kept
	// for the sandboxes.
	got := build(t, f, svc, templates.BuildRequest{Name: "srv:v1", Image: ref, Steps: steps(t, `{"type":"RUN","args":["make"]}`),
		StartCmd: "serve --port 8000", ReadyCmd: "check port"})
	if got.Status != store.TemplateReady || !strings.Contains(got.Log, "finalize: ready after") {
		t.Fatalf("build: %s %q\n%s", got.Status, got.FailureReason, got.Log)
	}
	if cmds := strings.Join(host.commands(), ";"); !strings.HasPrefix(cmds, "make;serve --port 8000;check port") {
		t.Fatalf("ran %q", cmds)
	}
	host.mu.Lock()
	last := host.starts[len(host.starts)-1]
	host.mu.Unlock()
	if len(last) != 1 {
		t.Fatalf("finalize's sandbox from layers %v", last)
	}
	img, err := svc.Find(t.Context(), f.alice.AccountID, "srv:v1")
	if err != nil || img.StartCmd != "serve --port 8000" || img.ReadyCmd != "check port" {
		t.Fatalf("image %+v %v", img, err)
	}

	// A ready command that never passes fails the build.
	got = build(t, f, svc, templates.BuildRequest{Name: "srv:v2", Image: ref, StartCmd: "serve", ReadyCmd: "never-ready"})
	if got.Status != store.TemplateFailed || got.FailureReason != "finalize: the ready command did not pass within 300ms" {
		t.Fatalf("never ready: %s %q", got.Status, got.FailureReason)
	}
	// A start command that fails fails it too.
	got = build(t, f, svc, templates.BuildRequest{Name: "srv:v3", Image: ref, StartCmd: "exit 3"})
	if got.Status != store.TemplateFailed || got.FailureReason != "finalize: the start command ended with exit code 3 before the template was ready" {
		t.Fatalf("failing start: %s %q", got.Status, got.FailureReason)
	}
}
