package bench

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
)

// LifetimeOptions configure the pause benchmark through a server: a
// sandbox's pause and resume with its memory (kept on the node) and with
// its files alone (kept in the blob store: the resume starts it again from
// them, which is what lets any node resume it), each with FilesMiB MiB of
// its own files; and, in the same run, the bare cost of the files' part:
// a tar of the same bytes written to disk and read back.
type LifetimeOptions struct {
	// Sandboxd is the sandboxd binary: the benchmark starts `serve` on a
	// scratch data dir (its blob store is that disk).
	Sandboxd  string
	ServeArgs []string
	Platform  string
	StateDir  string // scratch; created and removed
	// N is the pauses and resumes of each kind (default 5).
	N int
	// FilesMiB is what the sandbox writes before its pauses (default 64).
	FilesMiB int
	Progress progress.Tracker
}

// LifetimeCase is one kind of pause: its pauses' and resumes' latencies.
type LifetimeCase struct {
	Name   string  `json:"name"`
	Pause  Latency `json:"pause"`
	Resume Latency `json:"resume"`
	// Baseline marks the bare figures (a tar written, then read).
	Baseline bool `json:"baseline,omitempty"`
}

// LifetimeReport is what RunLifetime measured.
type LifetimeReport struct {
	Platform string         `json:"platform"`
	FilesMiB int            `json:"files_mib"`
	Cases    []LifetimeCase `json:"cases"`
}

// RunLifetime runs the pause benchmark.
func RunLifetime(ctx context.Context, o LifetimeOptions) (_ LifetimeReport, err error) {
	if o.N <= 0 {
		o.N = 5
	}
	if o.FilesMiB <= 0 {
		o.FilesMiB = 64
	}
	ph := startPhases(progress.Or(o.Progress), "bench lifetime", 4)
	defer func() { ph.done(err) }()
	rep := LifetimeReport{FilesMiB: o.FilesMiB}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return rep, err
	}
	defer os.RemoveAll(o.StateDir)
	ph.next("starting the server")
	srv, err := startServer(ctx, TTIOptions{Sandboxd: o.Sandboxd, ServeArgs: o.ServeArgs, Platform: o.Platform, StateDir: o.StateDir})
	if err != nil {
		return rep, err
	}
	defer srv.stop()
	if rep.Platform = o.Platform; rep.Platform == "" {
		if rep.Platform, err = srv.platform(ctx); err != nil {
			return rep, err
		}
	}
	key, err := srv.account(ctx, "bench-lifetime")
	if err != nil {
		return rep, err
	}
	for _, c := range []struct {
		name string
		body map[string]any
	}{
		{"sandboxd: pause with its memory (kept on the node), resume", map[string]any{}},
		{"sandboxd: pause of its files alone (to the blob store), resume from them", map[string]any{"memory": false}},
	} {
		ph.next(c.name)
		lc, err := srv.pauses(ctx, key, c.body, o)
		if err != nil {
			return rep, fmt.Errorf("%s: %w\nthe server's log ends:\n%s", c.name, err, tail(srv.logs.String(), 3000))
		}
		lc.Name = c.name
		rep.Cases = append(rep.Cases, lc)
	}
	ph.next("bare: the same bytes as a tar written to disk and read back")
	bare, err := tarBaseline(filepath.Join(o.StateDir, "bare"), o)
	if err != nil {
		return rep, err
	}
	rep.Cases = append(rep.Cases, bare)
	return rep, nil
}

// pauses creates a sandbox, then o.N times has it write o.FilesMiB MiB
// of new random bytes (not timed), pauses it (body is the pause's) and
// resumes it, timing each answer; a command after each resume checks the
// bytes are there. Each pause of the files so saves o.FilesMiB new MiB,
// and each resume restores the chain of the layers saved so far.
func (s *ttiServer) pauses(ctx context.Context, key string, body map[string]any, o LifetimeOptions) (LifetimeCase, error) {
	var lc LifetimeCase
	var c created
	if _, err := s.call(ctx, key, http.MethodPost, "/api/sandboxes", map[string]any{"timeout": 3_600_000}, &c); err != nil {
		return lc, err
	}
	if len(c.Sandboxes) == 0 {
		return lc, fmt.Errorf("create answered no sandbox")
	}
	id := c.Sandboxes[0].SandboxID
	defer func() {
		_, _ = s.call(context.WithoutCancel(ctx), key, http.MethodPost, "/api/sandboxes/"+id+"/stop", map[string]any{}, nil)
	}()
	exec := func(script string) (string, error) { return s.exec(ctx, key, id, script) }
	var pauses, resumes []time.Duration
	for i := range o.N {
		file := fmt.Sprintf("/opt/bench/data-%d", i)
		if _, err := exec(fmt.Sprintf("mkdir -p /opt/bench && head -c %d /dev/urandom > %s && sync", o.FilesMiB<<20, file)); err != nil {
			return lc, err
		}
		start := time.Now()
		if _, err := s.call(ctx, key, http.MethodPost, "/api/sandboxes/"+id+"/pause", body, nil); err != nil {
			return lc, fmt.Errorf("pause: %w", err)
		}
		pauses = append(pauses, time.Since(start))
		start = time.Now()
		if _, err := s.call(ctx, key, http.MethodPost, "/api/sandboxes/"+id+"/resume", map[string]any{}, nil); err != nil {
			return lc, fmt.Errorf("resume: %w", err)
		}
		resumes = append(resumes, time.Since(start))
		want := fmt.Sprint(o.FilesMiB << 20)
		if out, err := exec("wc -c < " + file); err != nil || strings.TrimSpace(out) != want {
			return lc, fmt.Errorf("after the resume, %s has %q bytes, want %s: %v", file, out, want, err)
		}
	}
	lc.Pause, lc.Resume = latency(pauses, o.N), latency(resumes, o.N)
	return lc, nil
}

// tarBaseline times the bare part of a pause of files: the same bytes
// written as a tar to a file and synced (the save), and read back into a
// file and synced (the restore), o.N times each.
func tarBaseline(dir string, o LifetimeOptions) (LifetimeCase, error) {
	lc := LifetimeCase{Name: "bare: a tar of the same bytes written and synced, read back and synced", Baseline: true}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return lc, err
	}
	src := filepath.Join(dir, "data")
	if err := writeRandom(src, int64(o.FilesMiB)<<20); err != nil {
		return lc, err
	}
	archive := filepath.Join(dir, "data.tar")
	var saves, restores []time.Duration
	for range o.N {
		start := time.Now()
		if err := tarFile(src, archive); err != nil {
			return lc, err
		}
		saves = append(saves, time.Since(start))
		start = time.Now()
		if err := untarFile(archive, filepath.Join(dir, "restored")); err != nil {
			return lc, err
		}
		restores = append(restores, time.Since(start))
	}
	lc.Pause, lc.Resume = latency(saves, o.N), latency(restores, o.N)
	return lc, nil
}

// writeRandom writes n random bytes to path.
func writeRandom(path string, n int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(f, rand.Reader, n); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// tarFile writes src as the one entry of the tar archive at dst, synced.
func tarFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(out)
	hdr, err := tar.FileInfoHeader(fi, "")
	if err == nil {
		err = tw.WriteHeader(hdr)
	}
	if err == nil {
		_, err = io.Copy(tw, in)
	}
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// untarFile reads the one entry of the tar archive at src into dst,
// synced.
func untarFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tr := tar.NewReader(in)
	if _, err := tr.Next(); err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, tr)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
