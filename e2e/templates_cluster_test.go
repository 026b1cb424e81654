package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxd/sandboxd/internal/blob/blobtest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// pushClusterTestImage pushes templateImage (the test root filesystem and an
// app layer) with a PATH to an in-process registry on loopback, as
// repo:tag, and returns its reference.
func pushClusterTestImage(t *testing.T, repoTag string) string {
	t.Helper()
	return pushImage(t, testRegistry(t), repoTag, templateImage(t, v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}})).String()
}

// buildTemplateVia starts a build through s and returns its id.
func buildTemplateVia(t *testing.T, s *server, k key, body map[string]any) string {
	t.Helper()
	r := s.as(k, "POST", "/api/templates", body)
	if r.Status != 202 {
		t.Fatalf("build %v: %d %s", body, r.Status, r.Raw)
	}
	return r.Body["template"].(map[string]any)["id"].(string)
}

// templateUntil polls template id through s until done says so of it.
func templateUntil(t *testing.T, s *server, k key, id string, within time.Duration, done func(tpl map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		r := s.as(k, "GET", "/api/templates/"+id, nil)
		if r.Status != 200 {
			t.Fatalf("get template %s: %d %s", id, r.Status, r.Raw)
		}
		tpl := r.Body["template"].(map[string]any)
		if done(tpl) {
			return tpl
		}
		if time.Now().After(deadline) {
			t.Fatalf("template %s after %s: %s", id, within, r.Raw)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func templateNotBuilding(tpl map[string]any) bool { return tpl["status"] != "building" }

// startTemplateCluster starts two nodes on one PostgreSQL and one S3
// store, with the network pools of this file's tests and the registry
// flag, a node declared down after downAfter without a heartbeat.
func startTemplateCluster(t *testing.T, downAfter string, extra ...string) ([]*clusterNode, *store.Store, string) {
	t.Helper()
	dsn := storetest.PostgresDSN(t)
	s3 := blobtest.StartS3(t)
	secret := filepath.Join(t.TempDir(), "cluster-secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("fedcba9876543210", 4)), 0o600); err != nil {
		t.Fatal(err)
	}
	var nodes []*clusterNode
	for _, pool := range []string{"10.242.0.0/16", "10.243.0.0/16"} {
		flags := []string{"--cluster-listen", freeAddr(t), "--cluster-secret-file", secret, "--blob-store", s3,
			"--node-down-after", downAfter, "--network-pool", pool, "--templates-allow-private-registries"}
		flags = append(flags, extra...)
		nodes = append(nodes, &clusterNode{server: startServer(t, dsn, flags...), flags: flags})
	}
	st, err := store.Open(context.Background(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return nodes, st, dsn
}

// TestTemplateCluster: a template built on one node starts on another.
// Two nodes on one PostgreSQL and one S3 store; a template (the test image
// and a RUN step) is built through node A, on A; a sandbox from it is
// placed on node B (A cordoned), whose cache lacks the image: B
// materialises the image's root filesystem from S3 on that first create,
// once, and the sandbox sees the image's file and the step's. Deleting the
// template removes its root filesystem from S3 and node A's copy; node
// B's goes at B's next collection (at its start, then hourly). (Test names stay short:
// sandboxes' sockets live under the test's temporary directory.)
func TestTemplateCluster(t *testing.T) {
	ref := pushClusterTestImage(t, "apps/clustered:v1")
	nodes, st, dsn := startTemplateCluster(t, "20s")
	a, b := nodes[0], nodes[1]
	ids := map[*server]string{a.server: nodeIDOf(t, a.server), b.server: nodeIDOf(t, b.server)}
	acct := a.createAccount("clustered", false)
	k := a.createKey(acct.ID)

	id := buildTemplateVia(t, a.server, k, map[string]any{"name": "clustered:v1", "image": ref,
		"steps": []map[string]any{{"type": "RUN", "args": []string{"echo from-the-step > /opt/step.txt"}}}})
	tpl := templateUntil(t, a.server, k, id, 4*time.Minute, templateNotBuilding)
	if tpl["status"] != "ready" || !strings.Contains(fmt.Sprint(tpl["log"]), "root filesystem stored in the blob store") {
		t.Fatalf("build: %v", tpl)
	}
	row, err := st.GetTemplate(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if row.NodeID != ids[a.server] {
		t.Fatalf("built on %s, not node A %s", row.NodeID, ids[a.server])
	}
	cachedOn := func(s *server) bool {
		_, err := os.Stat(filepath.Join(s.dataDir, "templates", strings.ReplaceAll(row.Digest, ":", "-")))
		return err == nil
	}
	if !cachedOn(a.server) || cachedOn(b.server) {
		t.Fatalf("cached on A %v, on B %v; want A only", cachedOn(a.server), cachedOn(b.server))
	}

	// The first create on B (through A, which is cordoned): B brings the
	// image from S3.
	var first time.Duration
	sid := onlyOn(t, a, ids, ids[b.server], func() string {
		start := time.Now()
		sb := a.createSandbox(k, map[string]any{"template": "clustered:v1"})
		first = time.Since(start)
		return sb["sandboxId"].(string)
	})
	if nodeOf(t, st, sid) != ids[b.server] {
		t.Fatalf("sandbox %s is on %s, not node B", sid, nodeOf(t, st, sid))
	}
	if !cachedOn(b.server) || !strings.Contains(b.logs.String(), "image materialised from the blob store") {
		t.Fatalf("node B did not materialise the image (cached %v); its logs:\n%s", cachedOn(b.server), b.logs.String())
	}
	r := a.as(k, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "cat /opt/app/hello.txt /opt/step.txt"}})
	if r.Status != 200 || r.Body["stdout"] != "hello from the image\nfrom-the-step\n" {
		t.Fatalf("exec on node B: %d %s", r.Status, r.Raw)
	}
	// A second create on B: cached now.
	var second time.Duration
	sid2 := onlyOn(t, a, ids, ids[b.server], func() string {
		start := time.Now()
		sb := b.createSandbox(k, map[string]any{"template": "clustered:v1"})
		second = time.Since(start)
		return sb["sandboxId"].(string)
	})
	t.Logf("create from a template on a node without its image: first %v (materialise included), second %v", first.Round(time.Millisecond), second.Round(time.Millisecond))
	if n := strings.Count(b.logs.String(), "image materialised from the blob store"); n != 1 {
		t.Fatalf("node B materialised the image %d times", n)
	}

	// Delete: its root filesystem leaves S3 and the row its digest.
	for _, s := range []string{sid, sid2} {
		a.as(k, "POST", "/api/sandboxes/"+s+"/stop", nil)
	}
	if r := a.as(k, "DELETE", "/api/templates/"+id, nil); r.Status != 200 {
		t.Fatalf("delete: %d %s", r.Status, r.Raw)
	}
	if _, err := st.GetTemplateImage(context.Background(), row.Digest); err == nil {
		t.Fatal("the image's root filesystem is still recorded in the blob store")
	}
	if cachedOn(a.server) {
		t.Fatal("node A kept its cached image after the delete")
	}
	// Node B's copy goes when it starts again.
	if !cachedOn(b.server) {
		t.Fatal("node B's copy went before its restart")
	}
	b.stop()
	b2 := startServerIn(t, b.dataDir, dsn, b.flags...)
	for deadline := time.Now().Add(30 * time.Second); cachedOn(b2); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("node B kept its copy of the deleted template's image after its restart; its logs:\n%s", b2.logs.String())
		}
	}
}

// TestTemplateRestart: a build survives a restart of sandboxd. Its RUN
// step is slow; the server is killed (SIGKILL) while the step runs, and
// started again on the same data dir and database: it resumes the build,
// which starts over (the crash's build sandbox destroyed by the
// reconcile) and ends ready, and a sandbox from it has the step's file.
func TestTemplateRestart(t *testing.T) {
	ref := pushClusterTestImage(t, "apps/slow:v1")
	flags := []string{"--templates-allow-private-registries", "--network-pool", "10.243.0.0/16"}
	s := startServer(t, filepath.Join(t.TempDir(), "templates.db"), flags...)
	acct := s.createAccount("restarted", false)
	k := s.createKey(acct.ID)
	id := buildTemplateVia(t, s, k, map[string]any{"name": "slow:v1", "image": ref,
		"steps": []map[string]any{{"type": "RUN", "args": []string{"echo started; sleep 5; echo slow > /opt/slow.txt"}}}})
	// Killed in the middle of the step.
	templateUntil(t, s, k, id, 3*time.Minute, func(tpl map[string]any) bool {
		if tpl["status"] != "building" {
			t.Fatalf("build ended before the restart: %v", tpl)
		}
		return strings.Contains(fmt.Sprint(tpl["log"]), "started")
	})
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = s.cmd.Wait()

	s = startServerIn(t, s.dataDir, s.dsn, flags...)
	tpl := templateUntil(t, s, k, id, 4*time.Minute, templateNotBuilding)
	log := fmt.Sprint(tpl["log"])
	if tpl["status"] != "ready" || strings.Count(log, "resolving "+ref) != 2 || !strings.Contains(log, "ready: ") {
		t.Fatalf("after the restart: %v", tpl)
	}
	if !strings.Contains(s.logs.String(), "templates: build resumed") {
		t.Fatalf("the restarted server did not resume the build; its logs:\n%s", s.logs.String())
	}
	sb := s.createSandbox(k, map[string]any{"template": "slow:v1"})
	r := s.as(k, "POST", "/api/sandboxes/"+sb["sandboxId"].(string)+"/exec", map[string]any{"command": "cat", "args": []string{"/opt/slow.txt", "/opt/app/hello.txt"}})
	if r.Status != 200 || r.Body["stdout"] != "slow\nhello from the image\n" {
		t.Fatalf("exec: %d %s", r.Status, r.Raw)
	}
	s.as(k, "POST", "/api/sandboxes/"+sb["sandboxId"].(string)+"/stop", nil)
}

// TestTemplateNodeLost: a build in a cluster survives the loss of its
// node. Node A builds a template with a slow RUN step and is killed
// (SIGKILL) during the step; node B declares it down and builds the
// template from the start; a sandbox from it runs on B with the step's
// file. A, started again, destroys its build sandbox and rejoins.
func TestTemplateNodeLost(t *testing.T) {
	ref := pushClusterTestImage(t, "apps/lost:v1")
	nodes, _, dsn := startTemplateCluster(t, "5s")
	a, b := nodes[0], nodes[1]
	acct := a.createAccount("lost", false)
	k := a.createKey(acct.ID)
	id := buildTemplateVia(t, a.server, k, map[string]any{"name": "lost:v1", "image": ref,
		"steps": []map[string]any{{"type": "RUN", "args": []string{"echo started; sleep 8; echo late > /opt/late.txt"}}}})
	templateUntil(t, b.server, k, id, 3*time.Minute, func(tpl map[string]any) bool {
		if tpl["status"] != "building" {
			t.Fatalf("build ended before node A was lost: %v", tpl)
		}
		return strings.Contains(fmt.Sprint(tpl["log"]), "started")
	})
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Wait()
	killed := time.Now()

	tpl := templateUntil(t, b.server, k, id, 4*time.Minute, templateNotBuilding)
	log := fmt.Sprint(tpl["log"])
	if tpl["status"] != "ready" || strings.Count(log, "resolving "+ref) != 2 {
		t.Fatalf("after node A was lost: %v", tpl)
	}
	if !strings.Contains(b.logs.String(), "templates: build of a down node taken over") {
		t.Fatalf("node B did not take the build over; its logs:\n%s", b.logs.String())
	}
	t.Logf("the build was ready %v after its node was killed (--node-down-after 5s, a step of 8 s)", time.Since(killed).Round(100*time.Millisecond))
	sb := b.createSandbox(k, map[string]any{"template": "lost:v1"})
	r := b.as(k, "POST", "/api/sandboxes/"+sb["sandboxId"].(string)+"/exec", map[string]any{"command": "cat", "args": []string{"/opt/late.txt"}})
	if r.Status != 200 || r.Body["stdout"] != "late\n" {
		t.Fatalf("exec: %d %s", r.Status, r.Raw)
	}
	b.as(k, "POST", "/api/sandboxes/"+sb["sandboxId"].(string)+"/stop", nil)
	// A comes back: its reconcile destroys the build sandbox the kill
	// left, and its Resume finds nothing to build.
	startServerIn(t, a.dataDir, dsn, a.flags...)
}
