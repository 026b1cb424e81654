package sandbox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// fakeTemplates is a catalog of ready templates, by id; Find takes the
// name as the id.
type fakeTemplates struct {
	mu   sync.Mutex
	imgs map[string]templates.Image
}

func (f *fakeTemplates) Find(_ context.Context, _, name string) (templates.Image, error) {
	return f.ByID(context.Background(), name)
}

func (f *fakeTemplates) ByID(_ context.Context, id string) (templates.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	img, ok := f.imgs[id]
	if !ok {
		return img, errdefs.New(errdefs.ErrNotFound, "its template was deleted")
	}
	return img, nil
}

func (f *fakeTemplates) remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.imgs, id)
}

// poolPlane is a plane whose manager has templates a, b, c (each on a
// root filesystem of its own, a with a start command) and a template pool
// of budget; it records the commands run in each sandbox.
func poolPlane(t *testing.T, budget int) (*plane, *fakeTemplates, func(id string) [][]string) {
	t.Helper()
	p := newPlane(t, Settings{TemplatePool: budget, Limits: runtime.Limits{Pids: 512}})
	tpls := &fakeTemplates{imgs: map[string]templates.Image{}}
	for _, id := range []string{"a", "b", "c"} {
		tpls.imgs[id] = templates.Image{TemplateID: id, Ref: id + ":latest", RootFS: "/templates/" + id, BaseImage: "oci:sha256:" + id,
			Config: oci.Config{Env: []string{"FROM_TEMPLATE=" + id}}}
	}
	a := tpls.imgs["a"]
	a.StartCmd = "serve --port 8000"
	tpls.imgs["a"] = a
	p.m.cfg.Templates = tpls
	var mu sync.Mutex
	ran := map[string][][]string{}
	p.rt.SetExec(func(_ context.Context, sb *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		mu.Lock()
		defer mu.Unlock()
		ran[sb.ID()] = append(ran[sb.ID()], req.Cmd)
		return runtime.ExecResult{}, nil
	})
	return p, tpls, func(id string) [][]string {
		mu.Lock()
		defer mu.Unlock()
		return ran[id]
	}
}

func (p *plane) createFrom(t *testing.T, template string) store.Sandbox {
	t.Helper()
	sb, _, err := p.m.Create(context.Background(), p.account.ID, CreateRequest{Lifetime: time.Minute, Template: template})
	if err != nil || sb.Status != store.SandboxRunning {
		t.Fatalf("create from %q: %v (%s)", template, err, sb.Status)
	}
	return sb
}

// poolSizes are the runtime's pools' sizes by template.
func poolSizes(rt interface{ PoolStats() runtime.PoolReport }) map[string]int {
	out := map[string]int{}
	for _, st := range rt.PoolStats().Pools {
		out[st.Name] = st.Size
	}
	return out
}

// TestTemplatePools: a template's first create gives it a pool, whose
// sandboxes (no owner, id, key, network or connection home) serve only
// its own template's creates, which run its start command after the
// hand-out and get their own key and environment; the budget goes to the
// templates most recently created from, by their last minute's creates;
// idle and deleted templates lose their pools; the metrics count a
// template's hits and misses.
func TestTemplatePools(t *testing.T) {
	ctx := context.Background()
	p, tpls, ran := poolPlane(t, 3)

	first := p.createFrom(t, "a")
	if p.rt.Pooled(first.ID) {
		t.Fatal("the first create of a template was pooled")
	}
	if got := poolSizes(p.rt); !maps(got, map[string]int{"a": 2}) {
		t.Fatalf("after a's first create: pools %v, want a:2", got)
	}
	if err := p.rt.FillPools(ctx); err != nil {
		t.Fatal(err)
	}
	for _, spec := range p.rt.PoolSpecs("a") {
		if spec.Template != "a" || spec.BaseDir != "/templates/a" || spec.BaseImage != "oci:sha256:a" || spec.ID != "" ||
			spec.Owner != "" || spec.HomeSocket != "" || spec.Network != nil || slices.ContainsFunc(spec.Env, func(kv string) bool {
			return strings.HasPrefix(kv, "RECOUP_API_KEY=")
		}) {
			t.Fatalf("a pooled sandbox's spec: %+v", spec)
		}
	}

	// Neither the built-in image nor template b takes a's sandbox.
	builtin, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
	if err != nil || p.rt.Pooled(builtin.ID) {
		t.Fatalf("built-in create: %v, pooled %v", err, p.rt.Pooled(builtin.ID))
	}
	b := p.createFrom(t, "b")
	if p.rt.Pooled(b.ID) {
		t.Fatal("b's create was handed a's sandbox")
	}
	// a's second create is; it is the sandbox's own, and its template's
	// start command runs in it after the hand-out.
	second := p.createFrom(t, "a")
	if !p.rt.Pooled(second.ID) {
		t.Fatal("a's second create was not served from its pool")
	}
	spec, _ := p.rt.Spec(second.ID)
	if spec.Owner != p.account.ID || !slices.Contains(spec.Env, "FROM_TEMPLATE=a") || !p.keyWorks(second.ID, p.sandboxKey(t, second.ID)) {
		t.Fatalf("the pooled sandbox's claim: %+v", spec)
	}
	if cmds := ran(second.ID); !slices.ContainsFunc(cmds, func(c []string) bool { return strings.Contains(strings.Join(c, " "), "serve --port 8000") }) {
		t.Fatalf("the start command did not run in the pooled sandbox: %q", cmds)
	}
	// Budget 3: a and b want 2 each; a (2 creates in the last minute)
	// gets them, b 1.
	if got := poolSizes(p.rt); !maps(got, map[string]int{"a": 2, "b": 1}) {
		t.Fatalf("pools %v, want a:2 b:1", got)
	}
	if err := p.rt.FillPools(ctx); err != nil {
		t.Fatal(err)
	}
	if b2 := p.createFrom(t, "b"); !p.rt.Pooled(b2.ID) {
		t.Fatal("b's second create was not pooled")
	}
	if builtin2, _, _ := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute}); p.rt.Pooled(builtin2.ID) {
		t.Fatal("a built-in create was handed a template's sandbox")
	}
	// A third template, at most 3 pools: one each now (c most recent).
	p.createFrom(t, "c")
	if got := poolSizes(p.rt); !maps(got, map[string]int{"a": 1, "b": 1, "c": 1}) {
		t.Fatalf("pools %v, want one each", got)
	}

	if got := poolCounts(t, p.m); got["hit"] != 2 || got["miss"] != 3 {
		t.Fatalf("template pool metrics %v: want 2 hits, 3 misses (each template's first create)", got)
	}

	// A deleted template's pool goes at the next tending; idle ones 10
	// minutes after their last create.
	tpls.remove("b")
	p.m.tendTemplatePools(ctx)
	if got := poolSizes(p.rt); !maps(got, map[string]int{"a": 1, "c": 1}) {
		t.Fatalf("after b's delete: pools %v", got)
	}
	later := time.Now().Add(templateIdle + time.Minute)
	p.m.now = func() time.Time { return later }
	p.m.tendTemplatePools(ctx)
	if got := poolSizes(p.rt); len(got) != 0 {
		t.Fatalf("idle pools kept: %v", got)
	}
}

// TestTemplatePoolsLRU: with more templates than the budget, the least
// recently created from has none.
func TestTemplatePoolsLRU(t *testing.T) {
	p, _, _ := poolPlane(t, 2)
	for _, id := range []string{"a", "b", "c"} {
		p.createFrom(t, id)
	}
	if got := poolSizes(p.rt); !maps(got, map[string]int{"b": 1, "c": 1}) {
		t.Fatalf("pools %v, want b and c", got)
	}
	// Off: no pools at all.
	p, _, _ = poolPlane(t, 0)
	p.createFrom(t, "a")
	if got := poolSizes(p.rt); len(got) != 0 {
		t.Fatalf("template pool 0: pools %v", got)
	}
}

// TestTemplatePoolsLeaveACreatesRoom: a pool is refilled only while the
// node's disk could still admit a create beside it, and its sandboxes
// count as warm ones in the admission.
func TestTemplatePoolsLeaveACreatesRoom(t *testing.T) {
	const gib = int64(1) << 30
	ctx := context.Background()
	p, _, _ := poolPlane(t, 4)
	p.m.cfg.Settings.Limits.DiskBytes, p.m.cfg.Settings.DiskReserveBytes = 4*gib, gib
	p.m.diskFreeFn = func(string) (int64, error) { return 13 * gib, nil }
	// 13 free - 1 reserved - 4 for a's sandbox: 8 left; a wants 2 pooled,
	// but the second would leave no room for a create.
	p.createFrom(t, "a")
	if err := p.rt.FillPools(ctx); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("filling beyond a create's room: %v", err)
	}
	if st := p.rt.PoolStats().Pools[0]; st.Ready != 1 || st.Size != 2 {
		t.Fatalf("pool %+v: want 1 of 2 ready", st)
	}
	if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute}); err != nil {
		t.Fatalf("the create the pool left room for: %v", err)
	}
	if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute}); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("a create beyond the disk (the pooled sandbox counted): %v", err)
	}
}

func maps(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// poolCounts are sandboxd_pool_total{pool="template"} by event.
func poolCounts(t *testing.T, m *Manager) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.PrewarmMetrics())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sandboxd_pool_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			if label(mt, "pool") == "template" {
				out[label(mt, "event")] = mt.GetCounter().GetValue()
			}
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
