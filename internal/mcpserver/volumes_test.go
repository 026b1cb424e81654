package mcpserver

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/store"
)

// structured decodes a tool's structured answer into out.
func structured(t *testing.T, res *mcp.CallToolResult, out any) {
	t.Helper()
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
}

// volumeCall calls a volume tool that must succeed and answers its volume.
func volumeCall(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) contract.Volume {
	t.Helper()
	res := callFull(t, cs, name, args)
	var out contract.VolumeResponse
	structured(t, res, &out)
	if res.IsError || out.Status != "success" || out.Volume.ID == "" {
		t.Fatalf("%s %v: %+v", name, args, res.Content)
	}
	return out.Volume
}

// listedVolumes answers list_volumes.
func listedVolumes(t *testing.T, cs *mcp.ClientSession, args map[string]any) []contract.Volume {
	t.Helper()
	res := callFull(t, cs, "list_volumes", args)
	var out contract.VolumesResponse
	structured(t, res, &out)
	if res.IsError || out.Status != "success" || out.Volumes == nil {
		t.Fatalf("list_volumes %v: %+v", args, res.Content)
	}
	return out.Volumes
}

// toolRefusal calls a tool that must fail and answers its message and
// HTTP status.
func toolRefusal(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (string, int) {
	t.Helper()
	res := callFull(t, cs, name, args)
	var out toolError
	structured(t, res, &out)
	if !res.IsError || out.Status != "error" {
		t.Fatalf("%s %v: not refused: %+v", name, args, res.Content)
	}
	return out.Error, out.StatusCode
}

// TestVolumeTools: the volume tools over the real volumes service and
// store (a volume is a row until a sandbox attaches it, and the
// attachments here are rows too): create, list with attachments, grow,
// fork, the service's refusals with their statuses (a name taken, a
// shrink, a delete or resize while attached: 409), delete, and another
// account sees and touches nothing.
func TestVolumeTools(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	alice, bob := f.connect(t, "alice"), f.connect(t, "bob")

	data := volumeCall(t, alice, "create_volume", map[string]any{"name": "data"})
	if !strings.HasPrefix(data.ID, "vol_") || data.Name != "data" || data.SizeMB != 1024 || len(data.Attachments) != 0 || data.ForkedFrom != "" || data.MicroVMWritten {
		t.Fatalf("created %+v", data)
	}
	if small := volumeCall(t, alice, "create_volume", map[string]any{"name": "small", "size_mb": 64}); small.SizeMB != 64 {
		t.Fatalf("size_mb 64: %+v", small)
	}

	// The API's refusals, with its messages and statuses.
	for _, tc := range []struct {
		tool   string
		args   map[string]any
		want   string
		status int
	}{
		{"create_volume", map[string]any{"name": "data"}, `has a volume called "data"`, 409},
		{"create_volume", map[string]any{"name": "no spaces"}, "want 1 to 63 letters", 400},
		{"create_volume", map[string]any{"name": "vol_x"}, "want 1 to 63 letters", 400},
		{"create_volume", map[string]any{"name": "big", "size_mb": 8192}, "at most 4096 MiB on this server", 400},
		{"create_volume", map[string]any{"name": "x", "size_mb": 10}, "size_mb must be a whole number of MiB, at least 64", 400},
		{"resize_volume", map[string]any{"name": "data", "size_mb": 512}, "a volume only grows", 400},
		{"resize_volume", map[string]any{"name": "nope", "size_mb": 2048}, `volume "nope" not found`, 404},
		{"resize_volume", map[string]any{"name": "data"}, "size_mb is required", 400},
		{"fork_volume", map[string]any{"name": "data", "new_name": "small"}, `has a volume called "small"`, 409},
		{"fork_volume", map[string]any{"name": "nope", "new_name": "copy"}, `volume "nope" not found`, 404},
		{"delete_volume", map[string]any{"name": "nope"}, `volume "nope" not found`, 404},
	} {
		msg, status := toolRefusal(t, alice, tc.tool, tc.args)
		if !strings.Contains(msg, tc.want) || status != tc.status {
			t.Errorf("%s %v: %d %q, want %d %q", tc.tool, tc.args, status, msg, tc.status, tc.want)
		}
	}

	// Grow it, by name then by id.
	if grown := volumeCall(t, alice, "resize_volume", map[string]any{"name": "data", "size_mb": 2048}); grown.SizeMB != 2048 || grown.ID != data.ID {
		t.Fatalf("resized %+v", grown)
	}
	if grown := volumeCall(t, alice, "resize_volume", map[string]any{"name": data.ID, "size_mb": 3072}); grown.SizeMB != 3072 {
		t.Fatalf("resized by id %+v", grown)
	}
	fork := volumeCall(t, alice, "fork_volume", map[string]any{"name": "data", "new_name": "data-copy"})
	if fork.Name != "data-copy" || fork.ForkedFrom != data.ID || fork.SizeMB != 3072 || fork.ID == data.ID {
		t.Fatalf("forked %+v", fork)
	}

	// A sandbox that has it attached: listed with it, and it is neither
	// deleted nor resized meanwhile.
	sb := store.Sandbox{AccountID: f.alice.ID, NodeID: "here", Status: store.SandboxRunning, Runtime: "gvisor", Deadline: time.Now().Add(time.Hour),
		Volumes: []store.VolumeAttachment{{VolumeID: data.ID, Path: "/data", ReadOnly: true}}}
	if err := f.st.CreateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	list := listedVolumes(t, alice, nil)
	var names []string
	for _, v := range list {
		names = append(names, v.Name)
		if v.Name == "data" && (len(v.Attachments) != 1 || v.Attachments[0] != (contract.VolumeAttachment{SandboxID: sb.ID, Path: "/data", ReadOnly: true})) {
			t.Errorf("data's attachments %+v", v.Attachments)
		}
	}
	if strings.Join(names, ",") != "data,data-copy,small" {
		t.Fatalf("listed %v", names)
	}
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"delete_volume", map[string]any{"name": "data"}},
		{"resize_volume", map[string]any{"name": "data", "size_mb": 4096}},
	} {
		if msg, status := toolRefusal(t, alice, tc.tool, tc.args); status != 409 || !strings.Contains(msg, sb.ID) {
			t.Errorf("%s while attached: %d %q", tc.tool, status, msg)
		}
	}

	// Another account sees none of them, and may not act for alice.
	if got := listedVolumes(t, bob, nil); len(got) != 0 {
		t.Fatalf("bob lists %+v", got)
	}
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"delete_volume", map[string]any{"name": "data-copy"}, "not found"},
		{"delete_volume", map[string]any{"name": fork.ID}, "not found"},
		{"fork_volume", map[string]any{"name": data.ID, "new_name": "mine"}, "not found"},
		{"resize_volume", map[string]any{"name": "small", "size_mb": 128}, "not found"},
		{"list_volumes", map[string]any{"account_id": f.alice.ID}, "Access denied to specified account_id"},
		{"create_volume", map[string]any{"name": "x", "account_id": f.alice.ID}, "Access denied to specified account_id"},
	} {
		if msg, _ := toolRefusal(t, bob, tc.tool, tc.args); !strings.Contains(msg, tc.want) {
			t.Errorf("bob %s %v: %q, want %q", tc.tool, tc.args, msg, tc.want)
		}
	}
	// A sandbox's key lists them (the refusal of the other tools is
	// TestOtherAccounts').
	if got := listedVolumes(t, f.connect(t, "alice-sandbox"), nil); len(got) != 3 {
		t.Fatalf("the sandbox key lists %+v", got)
	}

	// Deleted: gone from the list; the name is free again.
	if gone := volumeCall(t, alice, "delete_volume", map[string]any{"name": "data-copy"}); gone.ID != fork.ID {
		t.Fatalf("deleted %+v", gone)
	}
	if got := listedVolumes(t, alice, nil); len(got) != 2 {
		t.Fatalf("after the delete: %+v", got)
	}
	volumeCall(t, alice, "create_volume", map[string]any{"name": "data-copy", "size_mb": 128})
}

// TestCreateWithVolumesRefused: a create's volumes are checked as POST
// /api/sandboxes checks them, before any sandbox is started (the sandbox
// service of these tests may not be reached); an existing sandbox takes
// none. Their mounts are tested in e2e.
func TestCreateWithVolumesRefused(t *testing.T) {
	f := newFixture(t)
	cs := f.connect(t, "alice")
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"run_command", map[string]any{"command": "ls", "sandbox_id": "sbx_x", "volumes": []any{map[string]any{"name": "data", "path": "/data"}}}, "volumes is for a new sandbox, not with sandbox_id"},
		{"run_command", map[string]any{"command": "ls", "volumes": []any{map[string]any{"name": "data"}}}, "Each volume must have a path"},
		{"run_command", map[string]any{"command": "ls", "volumes": []any{map[string]any{"path": "/data"}}}, "Each volume must have a name"},
		{"run_command", map[string]any{"command": "ls", "volumes": "data"}, "Expected array"},
		{"prompt_sandbox", map[string]any{"prompt": "hi", "volumes": []any{map[string]any{"name": "data", "path": "/data", "read_only": "yes"}}}, "Expected boolean"},
	} {
		msg, status := toolRefusal(t, cs, tc.tool, tc.args)
		if !strings.Contains(msg, tc.want) || status != 400 {
			t.Errorf("%s %v: %d %q, want %q", tc.tool, tc.args, status, msg, tc.want)
		}
	}
}
