package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// buildNetwork is a network owner that also sets networks up and tears
// them down, recording the policies it was given.
type buildNetwork struct {
	fakeNetwork
	set     []netpol.Policy
	stopped []string
}

func (*buildNetwork) FailureReason() string { return "no network" }

func (n *buildNetwork) Prestart(_ context.Context, sb store.Sandbox, spec *runtime.Spec) error {
	var p netpol.Policy
	if err := json.Unmarshal([]byte(sb.Network), &p); err != nil {
		return err
	}
	n.set = append(n.set, p)
	spec.Network = &runtime.Network{Netns: "/run/netns/" + sb.ID}
	return nil
}

func (n *buildNetwork) Stop(_ context.Context, id string) error {
	n.stopped = append(n.stopped, id)
	return nil
}

// TestStartBuildSandbox: a build sandbox is a runtime sandbox without a
// row, key or connection home, on the build's base and layers, with a
// network of the build's policy; stop destroys it and its network. A
// runtime that cannot take any root filesystem refuses it.
func TestStartBuildSandbox(t *testing.T) {
	ctx := context.Background()
	net := &buildNetwork{fakeNetwork: fakeNetwork{nets: map[string]bool{}}}
	p := newPlane(t, Settings{}, net)
	req := templates.BuildSandbox{ID: "bld_1", BaseDir: "/images/x", BaseImage: "oci:sha256:aa",
		Layers: []runtime.Layer{{ID: "sha256:bb", R: strings.NewReader("")}}, Network: netpol.Policy{Mode: netpol.ModeEgress}}
	rsb, stop, err := p.m.StartBuildSandbox(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := p.rt.Spec("bld_1")
	if rsb.ID() != "bld_1" || spec.BaseDir != "/images/x" || spec.BaseImage != "oci:sha256:aa" || len(spec.Layers) != 1 ||
		spec.HomeSocket != "" || spec.Owner != "" || spec.Network == nil || len(spec.Env) != 0 {
		t.Fatalf("spec %+v", spec)
	}
	if len(net.set) != 1 || net.set[0].Mode != netpol.ModeEgress {
		t.Fatalf("network policies %+v", net.set)
	}
	if rows, _ := p.st.ListSandboxes(ctx, p.account.ID); len(rows) != 0 {
		t.Fatalf("a build sandbox made %d rows", len(rows))
	}
	stop(ctx)
	if _, err := p.rt.Get(ctx, "bld_1"); !errors.Is(err, runtime.ErrNotFound) || len(net.stopped) != 1 || net.stopped[0] != "bld_1" {
		t.Fatalf("after stop: %v, networks torn down %v", err, net.stopped)
	}

	// Without a network owner: loopback only.
	bare := newPlane(t, Settings{})
	req.ID = "bld_2"
	req.Layers = nil
	if _, stop, err := bare.m.StartBuildSandbox(ctx, req); err != nil {
		t.Fatal(err)
	} else {
		stop(ctx)
	}
	if spec, _ := bare.rt.Spec("bld_2"); spec.Network != nil {
		t.Fatalf("a network without an owner: %+v", spec.Network)
	}

	bare.rt.SetCapabilities(runtime.Capabilities{})
	req.ID = "bld_3"
	if _, _, err := bare.m.StartBuildSandbox(ctx, req); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("on a runtime without AnyRootFS: %v", err)
	}
}
