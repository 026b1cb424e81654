package e2e

import (
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestConsoleTemplates drives the console's Templates view in headless
// Chromium against a real server and an in-process registry on loopback:
// build a template from an image with the form and see it become ready in
// its detail; build one from a Dockerfile whose RUN prints, sleeps and
// prints again, and see the first output in the log while the detail
// still says building, then the rest when it is ready (the detail
// refreshes by itself); a build of a missing image shows its failure
// reason; start a sandbox from the ready template through the create
// form (its run has the image's ENV, WORKDIR and files); a delete asks
// first, is refused while the sandbox runs (the API's message shown), and
// removes the template once it stopped.
func TestConsoleTemplates(t *testing.T) {
	chromium(t)
	shots := artifactsDir(t, "console-templates")
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	ref, err := name.ParseReference(host + "/apps/hello:v1")
	if err != nil {
		t.Fatal(err)
	}
	img := templateImage(t, v1.Config{
		Env:        []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "FOO=bar"},
		WorkingDir: "/opt/app",
	})
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	// Build sandboxes get a network: a pool of its own.
	s := startServer(t, "", "--templates-allow-private-registries", "--network-pool", "10.248.0.0/16")
	a := s.createAccount("tplui", false)
	k := s.createKey(a.ID)

	b := newConsoleBrowser(t, shots)
	eval, waitFor, goTo := b.eval, b.waitFor, b.goTo
	b.signIn(s.base, k.Key)

	// Build from an image with the form: the detail follows it to ready.
	goTo("#templates")
	b.fill("the name", "#tpl-name", "hello:v1")
	b.fill("the image", "#tpl-image", ref.String())
	b.shot("build-form")
	b.press("build", "#tpl-build")
	waitFor("the template's detail", `location.hash.startsWith('#template/tpl_')`, 30*time.Second)
	id := strings.TrimPrefix(eval(`location.hash`).(string), "#template/")
	waitFor("the template ready in the view", `document.getElementById('view-template').dataset.status === 'ready'`, 2*time.Minute)
	if got := b.text("#tpl-title"); got != "hello:v1" {
		t.Errorf("title %q", got)
	}
	if log := b.text("#tpl-log"); !strings.Contains(log, "ready: ") {
		t.Errorf("the build log in the view:\n%s", log)
	}
	if got := b.text(`#tpl-fields [data-field="Working directory"] dd`); got != "/opt/app" {
		t.Errorf("working directory shown %q", got)
	}
	b.shot("template-ready")

	// A Dockerfile whose build takes a while: its step's output shows in
	// the log while the view still says building.
	goTo("#templates")
	waitFor("the list", fmt.Sprintf(`!!document.querySelector('#templates-body tr[data-template=%q][data-status="ready"]')`, id), 30*time.Second)
	b.fill("the name", "#tpl-name", "slow:v1")
	b.fill("the Dockerfile", "#tpl-dockerfile", "FROM "+ref.String()+"\nRUN echo out-$((6*7)); sleep 6; echo done-$((7*8))\n")
	b.press("build", "#tpl-build")
	waitFor("the slow template's detail", `location.hash.startsWith('#template/tpl_') && document.getElementById('tpl-title').textContent === 'slow:v1'`, 30*time.Second)
	waitFor("the step's output while it builds",
		`document.getElementById('view-template').dataset.status === 'building' && document.getElementById('tpl-log').textContent.includes('out-42')`, 2*time.Minute)
	b.shot("template-building")
	waitFor("the slow template ready", `document.getElementById('view-template').dataset.status === 'ready' && document.getElementById('tpl-log').textContent.includes('done-56')`, 2*time.Minute)

	// A build that fails says why.
	goTo("#templates")
	b.fill("the name", "#tpl-name", "missing:v1")
	b.fill("the image", "#tpl-image", host+"/apps/missing:v1")
	b.press("build", "#tpl-build")
	waitFor("the failure", `document.getElementById('tpl-title').textContent === 'missing:v1' && document.getElementById('view-template').dataset.status === 'failed'`, 2*time.Minute)
	if got := b.text("#tpl-failure"); !strings.HasPrefix(got, "The build failed: ") || len(got) < len("The build failed: ")+5 {
		t.Errorf("failure shown %q", got)
	}
	goTo("#templates")
	waitFor("the failed row", `!!document.querySelector('#templates-body tr[data-ref="missing:v1"][data-status="failed"] .reason')`, 30*time.Second)
	b.shot("templates")

	// A sandbox from the ready template: its detail opens the create form
	// with the template chosen.
	goTo("#template/" + id)
	b.press("new sandbox from it", "#tpl-sandbox")
	waitFor("the create form with the template", `location.hash === '#sandboxes' && document.getElementById('new-template').value === 'hello:v1'`, 30*time.Second)
	b.fill("the command", "#new-command", "cat hello.txt; pwd; echo foo=$FOO")
	b.shot("create-from-template")
	b.press("create", "#create")
	waitFor("the run view", `location.hash.startsWith('#runs/run_')`, 3*time.Minute)
	runID := strings.TrimPrefix(eval(`location.hash`).(string), "#runs/")
	waitFor("the run's end", `document.getElementById('run-status').dataset.status === 'COMPLETED'`, 2*time.Minute)
	if log := b.text("#run-log"); !strings.Contains(log, "hello from the image") || !strings.Contains(log, "/opt/app") || !strings.Contains(log, "foo=bar") {
		t.Errorf("the run's log:\n%s", log)
	}
	run := s.as(k, "GET", "/api/tasks/runs?runId="+runID, nil)
	runs, _ := run.Body["runs"].([]any)
	if len(runs) != 1 {
		t.Fatalf("run %s: %s", runID, run.Raw)
	}
	sandboxID, _ := runs[0].(map[string]any)["sandboxId"].(string)
	if sandboxID == "" {
		t.Fatalf("run without its sandbox: %s", run.Raw)
	}

	// Delete: asked first; kept when the answer is no; refused while the
	// sandbox runs; done once it stopped.
	goTo("#template/" + id)
	waitFor("the detail", `document.getElementById('view-template').dataset.status === 'ready'`, 30*time.Second)
	b.press("delete", "#tpl-delete")
	waitFor("the question", `!document.getElementById('tpl-confirm').hidden && document.getElementById('tpl-confirm-text').textContent.includes('hello:v1')`, 10*time.Second)
	b.shot("delete-confirm")
	b.press("keep it", "#tpl-delete-no")
	waitFor("the question gone", `document.getElementById('tpl-confirm').hidden && !document.getElementById('tpl-delete').disabled`, 10*time.Second)
	if r := s.as(k, "GET", "/api/templates/"+id, nil); r.Status != 200 {
		t.Fatalf("kept template: %d %s", r.Status, r.Raw)
	}
	b.press("delete", "#tpl-delete")
	b.press("delete it", "#tpl-delete-yes")
	waitFor("the refusal", `document.getElementById('tpl-error').textContent.includes('in use')`, 30*time.Second)
	b.shot("delete-refused")
	if r := s.as(k, "POST", "/api/sandboxes/"+sandboxID+"/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Raw)
	}
	b.press("delete", "#tpl-delete")
	b.press("delete it", "#tpl-delete-yes")
	waitFor("the list without it", fmt.Sprintf(`location.hash === '#templates' && !!document.querySelector('#templates-body tr[data-ref="slow:v1"]') && !document.querySelector('#templates-body tr[data-template=%q]')`, id), 30*time.Second)
	if r := s.as(k, "GET", "/api/templates/"+id, nil); r.Status != 404 {
		t.Fatalf("deleted template: %d %s", r.Status, r.Raw)
	}

	// At a phone's width the view fits.
	b.viewport(390, 844)
	goTo("#templates")
	waitFor("the list", `!!document.querySelector('#templates-body tr[data-ref="slow:v1"]')`, 30*time.Second)
	b.noOverflow("templates")
	b.shot("templates-phone")
}
