package microvm_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestImageTemplate is a custom template's life on this backend at the
// runtime's level: two VMs booted at once on a directory like an unpacked
// OCI image (runtimetest.ImageRootfs: files of uid 1000, a setuid program,
// a hard link, symlinks, no mount points) share one base disk made for it;
// a build step runs as the image's user and its writable layer is captured
// (Snapshot); a VM started on the image and that layer (a template with a
// RUN step) has the step's files, still the user's. The image's
// /etc/resolv.conf is a dangling symlink, as systemd-resolved leaves it. Once the image's
// directory is gone, its base disk goes when the runtime starts again.
func TestImageTemplate(t *testing.T) {
	state := t.TempDir()
	r := newRuntime(t, state, nil)
	defer func() { r.Close() }()
	// Named as the templates cache names an unpacked image: its disk is
	// keyed by the digest, without a walk of the tree.
	digest := fmt.Sprintf("%x", sha256.Sum256([]byte("image fixture")))
	image := filepath.Join(t.TempDir(), "sha256-"+digest)
	if err := os.Rename(runtimetest.ImageRootfs(t), image); err != nil {
		t.Fatal(err)
	}
	// An image whose resolv.conf is systemd-resolved's link, to nothing.
	if err := os.Symlink("../run/systemd/resolve/stub-resolv.conf", filepath.Join(image, "etc", "resolv.conf")); err != nil {
		t.Fatal(err)
	}
	baseImage := "oci:sha256:" + digest
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	var (
		wg   sync.WaitGroup
		sbs  [2]runtime.Sandbox
		errs [2]error
	)
	for i, id := range []string{"build-a", "build-b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sbs[i], errs[i] = r.Create(ctx, runtime.Spec{ID: id, BaseDir: image, BaseImage: baseImage})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
		defer sbs[i].Destroy(context.Background())
	}
	disks, _ := filepath.Glob(filepath.Join(state, "bases", "*.ext4"))
	if len(disks) != 1 {
		t.Fatalf("base disks %v, want one for the image", disks)
	}
	// The guest's kernel honours the image's setuid bits, as Docker does.
	if euid := runtimetest.CheckImageRootfs(t, sbs[0]); euid != "0" {
		t.Errorf("a setuid-root program run by uid 1000 has euid %s", euid)
	}

	// vm-init's resolv.conf covers where the image's link leads.
	var rc bytes.Buffer
	if res, err := sbs[0].Exec(ctx, runtime.ExecRequest{Cmd: []string{"/bin/sh", "-c", "readlink /etc/resolv.conf; grep -q ' /run/systemd/resolve/stub-resolv.conf ' /proc/self/mountinfo && echo bound"},
		Stdout: &rc}); err != nil || res.ExitCode != 0 || rc.String() != "../run/systemd/resolve/stub-resolv.conf\nbound\n" {
		t.Fatalf("resolv.conf: %d %v %q", res.ExitCode, err, rc.String())
	}

	// A RUN step as the image's user, then its layer.
	build := sbs[1]
	var out, errb bytes.Buffer
	res, err := build.Exec(ctx, runtime.ExecRequest{Cmd: []string{"/bin/sh", "-c", "mkdir ~/data && echo built > ~/data/f && ln -s data/f ~/link"},
		User: runtimetest.ImageUser, Cwd: "/home/app", Stdout: &out, Stderr: &errb})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("step: %d %v %s", res.ExitCode, err, errb.String())
	}
	var layer bytes.Buffer
	man, err := build.Snapshot(ctx, &layer)
	if err != nil {
		t.Fatal(err)
	}
	if man.BaseImage != baseImage || man.Parent != "" {
		t.Fatalf("layer manifest %+v", man)
	}

	sb, err := r.Create(ctx, runtime.Spec{ID: "from-template", BaseDir: image, BaseImage: baseImage,
		Layers: []runtime.Layer{{ID: man.ID, R: bytes.NewReader(layer.Bytes())}}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	out.Reset()
	res, err = sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"/bin/sh", "-c", "id -u; cat ~/link; stat -c '%u:%g %a' ~/data ~/data/f; /opt/tool/bin/euid"},
		User: runtimetest.ImageUser, Cwd: "/home/app", Stdout: &out, Stderr: &errb})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("in a sandbox of the template: %d %v %s", res.ExitCode, err, errb.String())
	}
	if want := "1000\nbuilt\n1000:1000 755\n1000:1000 644\n0\n"; out.String() != want {
		t.Fatalf("in a sandbox of the template:\n%s\nwant:\n%s", out.String(), want)
	}
	if got := len(mustGlob(t, filepath.Join(state, "bases", "*.ext4"))); got != 1 {
		t.Fatalf("%d base disks after a sandbox with layers, want 1", got)
	}

	// The image's directory goes (its template was deleted): its disk goes
	// with the next start of the runtime, not while VMs use it.
	for _, s := range []runtime.Sandbox{sbs[0], sbs[1], sb} {
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(image); err != nil {
		t.Fatal(err)
	}
	r.Close()
	r = newRuntime(t, state, nil)
	if left := mustGlob(t, filepath.Join(state, "bases", "*")); len(left) != 0 {
		t.Fatalf("left in bases/: %v", left)
	}
}

func mustGlob(t *testing.T, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
