package gvisor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"io/fs"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestPauseHeldMemory pauses a sandbox that holds 256 MiB of memory:
// while paused nothing of it runs on the host (no sentry, gofer or stub
// process, no cgroup), the memory is in the checkpoint image, and after
// resume it is all there. It logs the pause and resume times and the
// image's size for zeros a process keeps (which the image compresses) and
// for random bytes in a tmpfs file (which it cannot).
func TestPauseHeldMemory(t *testing.T) {
	state := t.TempDir()
	r := newRuntime(t, state, nil)
	defer r.Close()
	base := runtimetest.Rootfs(t)
	const size = 256 << 20
	random := make([]byte, size)
	_, _ = mrand.NewChaCha8([32]byte{1}).Read(random)
	for _, kind := range []string{"zeros", "random"} {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			id := "held-" + kind
			sb, err := r.Create(ctx, runtime.Spec{ID: id, BaseDir: base, Limits: runtime.Limits{MemoryBytes: 1 << 30}})
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
			deadline := time.Now().Add(2 * time.Minute)
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

// TestPauseRefusesTCP: a sandbox with a TCP socket open inside is not
// paused (runsc of Debian 12 cannot save one an epoll set watches, and a
// failed save would end the sandbox); it runs on, and pauses once the
// socket is closed.
func TestPauseRefusesTCP(t *testing.T) {
	r := newRuntime(t, t.TempDir(), nil)
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := r.Create(ctx, runtime.Spec{ID: "tcp", BaseDir: runtimetest.Rootfs(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	if _, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"sh", "-c", "nc -l -p 8080 >/dev/null 2>&1 & sleep 0.5"}}); err != nil {
		t.Fatal(err)
	}
	err = r.Pause(ctx, "tcp")
	if err == nil || !strings.Contains(err.Error(), "TCP") {
		t.Fatalf("pause with a listening socket: %v", err)
	}
	t.Log(err)
	if res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"killall", "nc"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("the sandbox after a refused pause: %v %+v", err, res)
	}
	time.Sleep(200 * time.Millisecond)
	if err := r.Pause(ctx, "tcp"); err != nil {
		t.Fatalf("pause once the socket is closed: %v", err)
	}
	if err := r.Resume(ctx, "tcp"); err != nil {
		t.Fatal(err)
	}
}
