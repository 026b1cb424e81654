package gvisor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestPauseHeldMemory pauses a sandbox that holds 256 MiB of memory:
// while paused nothing of it runs on the host (no sentry, gofer or stub
// process, no cgroup), the memory is in the checkpoint image, and after
// resume it is all there; the image is within what MaxSaveBytes bounds it
// by. It logs the pause and resume times and the
// image's size for zeros a process keeps (which the image compresses) and
// for random bytes in a tmpfs file (which it cannot).
func TestPauseHeldMemory(t *testing.T) {
	state := t.TempDir()
	r := newRuntime(t, state, nil)
	defer r.Close()
	base := runtimetest.Rootfs(t)
	const size = 256 << 20
	limits := runtime.Limits{MemoryBytes: 1 << 30}
	random := make([]byte, size)
	_, _ = mrand.NewChaCha8([32]byte{1}).Read(random)
	for _, kind := range []string{"zeros", "random"} {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			id := "held-" + kind
			sb, err := r.Create(ctx, runtime.Spec{ID: id, BaseDir: base, Limits: limits})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Destroy(context.Background())
			cid := sandboxCID(t, state, id)
			shell := func(script string) string {
				t.Helper()
				var out, errb strings.Builder
				res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"sh", "-c", script}, Stdout: &out, Stderr: &errb})
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("%s: %v %+v %s", script, err, res, errb.String())
				}
				return out.String()
			}
			if kind == "zeros" {
				// tail keeps its input, one line without end, until EOF;
				// the loop holds that off until /tmp/go exists.
				shell(`(dd if=/dev/zero bs=1048576 count=256 2>/dev/null; while [ ! -e /tmp/go ]; do sleep 0.1; done) | tail | wc -c > /tmp/n 2>&1 &`)
			} else {
				// /run is a tmpfs: its files are the sentry's memory.
				if err := sb.WriteFile(ctx, "/run/blob", bytes.NewReader(random), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			// A bound, not a figure: busybox's tail grows its buffer for
			// the one 256 MiB line slowly, and on a busy host (make test
			// runs the e2e tests beside it) it took past two minutes.
			deadline := time.Now().Add(5 * time.Minute)
			for {
				st, err := sb.Stats(ctx)
				if err == nil && st.MemoryBytes > size {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the sandbox never held %d bytes: %+v %v", size, st, err)
				}
				time.Sleep(200 * time.Millisecond)
			}
			time.Sleep(time.Second) // the last writes

			start := time.Now()
			if err := r.Pause(ctx, id); err != nil {
				t.Fatal(err)
			}
			paused := time.Since(start)
			if running := hostProcesses(cid); len(running) > 0 {
				t.Errorf("processes of a paused sandbox run on the host: %v", running)
			}
			if cg, _ := filepath.Glob("/sys/fs/cgroup/*/sandboxd/" + cid); len(cg) > 0 {
				t.Errorf("a paused sandbox's cgroups are left: %v", cg)
			}
			image := treeBytes(t, filepath.Join(state, "sandboxes", cid, "checkpoint"))
			if kind == "random" && image < size {
				t.Errorf("checkpoint image of %d bytes for %d bytes of random memory", image, size)
			}
			// The node reserves this much of its disk before a pause.
			if bound := r.MaxSaveBytes(limits); image > bound {
				t.Errorf("checkpoint image of %d bytes, over the %d bytes MaxSaveBytes reserves for it", image, bound)
			}

			start = time.Now()
			if err := r.Resume(ctx, id); err != nil {
				t.Fatal(err)
			}
			resumed := time.Since(start)
			t.Logf("256 MiB of %s held: pause %v, resume %v, checkpoint image %.1f MiB",
				kind, paused.Round(time.Millisecond), resumed.Round(time.Millisecond), float64(image)/(1<<20))
			if kind == "random" {
				rc, err := sb.ReadFile(ctx, "/run/blob")
				if err != nil {
					t.Fatal(err)
				}
				defer rc.Close()
				h := sha256.New()
				if _, err := io.Copy(h, rc); err != nil {
					t.Fatal(err)
				}
				if want := sha256.Sum256(random); !bytes.Equal(h.Sum(nil), want[:]) {
					t.Fatal("the file in memory changed across pause and resume")
				}
				return
			}
			// End the input: what tail held in memory must come out whole.
			shell(`touch /tmp/go`)
			deadline = time.Now().Add(time.Minute)
			for {
				got := strings.TrimSpace(shell(`cat /tmp/n 2>/dev/null || true`))
				if got == "268435456" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after resume the process gave %q bytes, want %d", got, size)
				}
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
}

// sandboxCID is the container id that sandbox id claims.
func sandboxCID(t *testing.T, state, id string) string {
	t.Helper()
	target, err := os.Readlink(filepath.Join(state, "ids", id))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Base(target)
}

// hostProcesses lists the host's live (not zombie) processes whose command
// line names cid.
func hostProcesses(cid string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), cid) {
			continue
		}
		st, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
		if err != nil {
			continue
		}
		if i := strings.LastIndexByte(string(st), ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
			continue
		}
		out = append(out, strings.ReplaceAll(string(b), "\x00", " "))
	}
	return out
}

// treeBytes is the size on disk of the files under dir.
func treeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if fi, err := d.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPauseTCP: with the current runsc, a sandbox serving TCP inside (a
// listener, and connections to it made again and again) pauses, resumes
// and forks with its sockets: the server answers after resume and in the
// child. With Debian's runsc 20221219, which cannot save a TCP endpoint an
// epoll set watches (and a failed save would end the sandbox), the pause
// and the fork are refused while a socket is open, naming it, the sandbox
// runs on, and it pauses once the socket is closed.
func TestPauseTCP(t *testing.T) {
	serve := `mkdir -p /tmp/www && echo served > /tmp/www/index.html && httpd -p 8080 -h /tmp/www &&
(while :; do wget -q -O /tmp/got http://127.0.0.1:8080/index.html; sleep 0.1; done) >/dev/null 2>&1 & sleep 0.5`
	get := "wget -q -O - http://127.0.0.1:8080/index.html"
	t.Run("current", func(t *testing.T) {
		if _, err := os.Stat(gvisor.BundledRunsc); err != nil || os.Getenv("SANDBOXD_RUNSC") != "" {
			t.Skipf("%s not installed, or SANDBOXD_RUNSC names another", gvisor.BundledRunsc)
		}
		r := newRuntime(t, t.TempDir(), nil)
		defer r.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		sb, err := r.Create(ctx, runtime.Spec{ID: "tcp", BaseDir: runtimetest.Rootfs(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Destroy(context.Background())
		mustSh(ctx, t, sb, serve)
		if err := r.Pause(ctx, "tcp"); err != nil {
			t.Fatalf("pause with a server and its clients: %v", err)
		}
		if err := r.Resume(ctx, "tcp"); err != nil {
			t.Fatal(err)
		}
		if got := mustSh(ctx, t, sb, get); got != "served\n" {
			t.Fatalf("the server after resume: %q", got)
		}
		kids, err := r.Fork(ctx, "tcp", []runtime.Spec{{ID: "tcp-child"}})
		if err != nil {
			t.Fatalf("fork with a server and its clients: %v", err)
		}
		defer kids[0].Destroy(context.Background())
		if got := mustSh(ctx, t, kids[0], get); got != "served\n" {
			t.Fatalf("the server in the child: %q", got)
		}
	})
	t.Run("debian", func(t *testing.T) {
		debian, err := exec.LookPath("runsc")
		if err != nil {
			t.Skip("no runsc in PATH")
		}
		r := newRuntime(t, t.TempDir(), func(o *gvisor.Options) { o.RunscPath = debian })
		defer r.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		sb, err := r.Create(ctx, runtime.Spec{ID: "tcp", BaseDir: runtimetest.Rootfs(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Destroy(context.Background())
		mustSh(ctx, t, sb, "nc -l -p 8080 >/dev/null 2>&1 & sleep 0.5")
		for what, try := range map[string]func() error{
			"pause": func() error { return r.Pause(ctx, "tcp") },
			"fork": func() error {
				_, err := r.Fork(ctx, "tcp", []runtime.Spec{{ID: "tcp-child"}})
				return err
			},
		} {
			if err := try(); !errors.Is(err, runtime.ErrCannotPause) || !strings.Contains(err.Error(), "a TCP socket is open inside ([::]:8080 LISTEN)") {
				t.Fatalf("%s with a listening socket: %v", what, err)
			}
			if err := r.CheckSave(ctx, "tcp"); !errors.Is(err, runtime.ErrCannotPause) || !strings.Contains(err.Error(), "[::]:8080 LISTEN") {
				t.Fatalf("CheckSave with a listening socket: %v", err)
			}
			if got := mustSh(ctx, t, sb, "echo running"); got != "running\n" {
				t.Fatalf("after the refused %s: %q", what, got)
			}
		}
		mustSh(ctx, t, sb, "killall nc; sleep 0.2")
		// The agent's own sockets (its listener for sandboxd.internal,
		// a connection it accepted there) do not count.
		if err := r.CheckSave(ctx, "tcp"); err != nil {
			t.Fatalf("CheckSave once the socket is closed: %v", err)
		}
		if err := r.Pause(ctx, "tcp"); err != nil {
			t.Fatalf("pause once the socket is closed: %v", err)
		}
		if err := r.Resume(ctx, "tcp"); err != nil {
			t.Fatal(err)
		}
	})
}

// mustSh runs script in sb and returns its stdout, failing the test
// unless it exits 0.
func mustSh(ctx context.Context, t *testing.T, sb runtime.Sandbox, script string) string {
	t.Helper()
	var out, errb strings.Builder
	res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"sh", "-c", script}, Stdout: &out, Stderr: &errb})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%q: %v %+v %s", script, err, res, errb.String())
	}
	return out.String()
}

// TestReattachThawsFrozen: a container an earlier sandboxd left frozen
// (it died between the runsc pause and resume of a Quiesce or a fork) runs
// again once a new runtime re-attaches it.
func TestReattachThawsFrozen(t *testing.T) {
	state := t.TempDir()
	r := newRuntime(t, state, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := r.Create(ctx, runtime.Spec{ID: "frozen", BaseDir: runtimetest.Rootfs(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	runsc := r.Runsc().Path
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(runsc, "--root", filepath.Join(state, "runsc"), "pause", sandboxCID(t, state, "frozen")).CombinedOutput(); err != nil {
		t.Fatalf("runsc pause: %v: %s", err, out)
	}
	again := newRuntime(t, state, nil)
	defer again.Close()
	got, err := again.Get(ctx, "frozen")
	if err != nil {
		t.Fatal(err)
	}
	if out := mustSh(ctx, t, got, "echo thawed"); out != "thawed\n" {
		t.Fatalf("exec after the re-attach: %q", out)
	}
}

// TestSaveUnsupported: on a runsc whose checkpoint fails (a wrapper that
// refuses it, around a real runsc), the save trial finds it out and a
// pause or fork is refused before anything is touched, with
// ErrCannotPause naming the runsc's version and what to install; the
// sandbox runs on as it was and no child is left.
func TestSaveUnsupported(t *testing.T) {
	real := gvisor.DefaultRunsc()
	if p, err := exec.LookPath(real); err == nil {
		real = p
	} else {
		t.Skip("no runsc")
	}
	wrapper := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nfor a; do [ \"$a\" = checkpoint ] && { echo 'checkpoint: not in this build' >&2; exit 1; }; done\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := newRuntime(t, t.TempDir(), func(o *gvisor.Options) { o.RunscPath = wrapper })
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := r.Create(ctx, runtime.Spec{ID: "unsaved", BaseDir: runtimetest.Rootfs(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	mustSh(ctx, t, sb, "echo kept > /tmp/f")
	for what, try := range map[string]func() error{
		"pause": func() error { return r.Pause(ctx, "unsaved") },
		"fork": func() error {
			_, err := r.Fork(ctx, "unsaved", []runtime.Spec{{ID: "unsaved-child"}})
			return err
		},
	} {
		err := try()
		if !errors.Is(err, runtime.ErrCannotPause) || !strings.Contains(err.Error(), "runsc "+r.Runsc().Version) ||
			!strings.Contains(err.Error(), "install-runsc.sh") || strings.Contains(err.Error(), wrapper) {
			t.Fatalf("%s on a runsc that cannot save: %v", what, err)
		}
		if st, err := sb.State(ctx); err != nil || st != runtime.StateRunning {
			t.Fatalf("after the refused %s: %v %v", what, st, err)
		}
		if got := mustSh(ctx, t, sb, "cat /tmp/f"); got != "kept\n" {
			t.Fatalf("after the refused %s: %q", what, got)
		}
	}
	if _, err := r.Get(ctx, "unsaved-child"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("the child of the refused fork: %v", err)
	}
}
