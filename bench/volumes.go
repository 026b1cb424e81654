package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/volumes"
)

// VolumesOptions configure the volume benchmark: a sandbox's create with a
// volume of SizeMiB holding FillMiB of random bytes, next to a create
// without one, through a server (the volume's image on the node's disk);
// and the volume's sync to the blob store and fetch from it, as a
// cluster's nodes move it (the same image, the package's own code, a
// blob store on the same disk), next to the bare copy of its bytes.
type VolumesOptions struct {
	Sandboxd  string
	ServeArgs []string
	Platform  string
	StateDir  string // scratch; created and removed
	N         int    // creates, syncs and fetches of each kind (default 5)
	SizeMiB   int    // the volume's size (default 1024)
	FillMiB   int    // what a sandbox writes in it first (default 900)
	Progress  progress.Tracker
}

// VolumesCase is one measured operation.
type VolumesCase struct {
	Name     string  `json:"name"`
	Latency  Latency `json:"latency"`
	Baseline bool    `json:"baseline,omitempty"`
}

// VolumesReport is what RunVolumes measured.
type VolumesReport struct {
	Platform string `json:"platform"`
	SizeMiB  int    `json:"size_mib"`
	FillMiB  int    `json:"fill_mib"`
	// CopyBytes is the size of the volume's compressed copy in the blob
	// store (its data extents; random bytes do not compress).
	CopyBytes int64         `json:"copy_bytes"`
	Cases     []VolumesCase `json:"cases"`
}

// RunVolumes runs the volume benchmark.
func RunVolumes(ctx context.Context, o VolumesOptions) (_ VolumesReport, err error) {
	if o.N <= 0 {
		o.N = 5
	}
	if o.SizeMiB <= 0 {
		o.SizeMiB = 1024
	}
	if o.FillMiB <= 0 {
		o.FillMiB = 900
	}
	ph := startPhases(progress.Or(o.Progress), "bench volumes", 5)
	defer func() { ph.done(err) }()
	rep := VolumesReport{SizeMiB: o.SizeMiB, FillMiB: o.FillMiB}
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
	key, err := srv.account(ctx, "bench-volumes")
	if err != nil {
		return rep, err
	}
	ph.next(fmt.Sprintf("filling a %d MiB volume with %d MiB", o.SizeMiB, o.FillMiB))
	var made struct {
		Volume struct {
			ID string `json:"id"`
		} `json:"volume"`
	}
	if _, err := srv.call(ctx, key, http.MethodPost, "/api/volumes", map[string]any{"name": "bench", "size_mb": o.SizeMiB}, &made); err != nil {
		return rep, err
	}
	mount := map[string]any{"volumes": []map[string]any{{"name": "bench", "path": "/data"}}}
	id, err := srv.createStopLater(ctx, key, mount)
	if err != nil {
		return rep, err
	}
	if _, err := srv.exec(ctx, key, id, fmt.Sprintf("head -c %d /dev/urandom > /data/fill && sync", o.FillMiB<<20)); err != nil {
		return rep, err
	}
	if err := srv.stopSandbox(ctx, key, id); err != nil {
		return rep, err
	}

	ph.next("creates with the volume and without")
	for _, c := range []struct {
		name string
		body map[string]any
	}{
		{"sandboxd: create, no volume (cold)", map[string]any{}},
		{fmt.Sprintf("sandboxd: create with the %d MiB volume (cold; its image on the node)", o.SizeMiB), mount},
	} {
		var ds []time.Duration
		for range o.N {
			start := time.Now()
			id, err := srv.createStopLater(ctx, key, c.body)
			if err != nil {
				return rep, fmt.Errorf("%s: %w\nthe server's log ends:\n%s", c.name, err, tail(srv.logs.String(), 3000))
			}
			ds = append(ds, time.Since(start))
			if len(c.body) > 0 {
				if out, err := srv.exec(ctx, key, id, "wc -c < /data/fill"); err != nil || strings.TrimSpace(out) != fmt.Sprint(o.FillMiB<<20) {
					return rep, fmt.Errorf("the volume in a new sandbox: %q %v", out, err)
				}
			}
			if err := srv.stopSandbox(ctx, key, id); err != nil {
				return rep, err
			}
		}
		rep.Cases = append(rep.Cases, VolumesCase{Name: c.name, Latency: latency(ds, o.N)})
	}
	srv.stop()

	ph.next("sync to the blob store and fetch from it, between two nodes")
	img := filepath.Join(o.StateDir, "data", "volumes", made.Volume.ID+".img")
	moves, copyBytes, err := moveBetweenNodes(ctx, filepath.Join(o.StateDir, "move"), img, int64(o.SizeMiB)<<20, o.N)
	if err != nil {
		return rep, err
	}
	rep.CopyBytes = copyBytes
	rep.Cases = append(rep.Cases, moves...)

	ph.next("bare: the image's data copied and synced")
	var ds []time.Duration
	for i := range o.N {
		dst := filepath.Join(o.StateDir, fmt.Sprintf("bare-%d.img", i))
		start := time.Now()
		if err := host.CopySparse(img, dst, 0o600); err != nil {
			return rep, err
		}
		if err := syncFile(dst); err != nil {
			return rep, err
		}
		ds = append(ds, time.Since(start))
		_ = os.Remove(dst)
	}
	rep.Cases = append(rep.Cases, VolumesCase{Name: "bare: the image's data extents copied to a file and synced", Latency: latency(ds, o.N), Baseline: true})
	return rep, nil
}

// moveBetweenNodes times a volume's moves between two nodes of a cluster
// with the volumes package itself: a database and blob store of their own
// (on this disk), the image img as the volume's data; n times, the node
// that wrote it syncs it to the blob store as its writer ends (Stop) and
// the other fetches it as a sandbox there starts (Prestart).
func moveBetweenNodes(ctx context.Context, dir, img string, size int64, n int) ([]VolumesCase, int64, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, 0, err
	}
	st, err := store.Open(ctx, filepath.Join(dir, "db.sqlite"), nil)
	if err != nil {
		return nil, 0, err
	}
	defer st.Close()
	blobs, err := blob.NewLocal(filepath.Join(dir, "blobs"))
	if err != nil {
		return nil, 0, err
	}
	var nodes [2]*volumes.Service
	for i := range nodes {
		if nodes[i], err = volumes.New(volumes.Config{Store: st, Blobs: blobs, Sync: true, NodeID: fmt.Sprintf("node-%d", i), Dir: filepath.Join(dir, fmt.Sprintf("node-%d", i)), Runtime: "gvisor"}); err != nil {
			return nil, 0, err
		}
	}
	acct := store.Account{Name: "bench", Kind: store.AccountPersonal}
	if err := st.CreateAccount(ctx, &acct); err != nil {
		return nil, 0, err
	}
	v, err := nodes[0].Create(ctx, acct.ID, "bench", size)
	if err != nil {
		return nil, 0, err
	}
	var syncs, fetches []time.Duration
	for i := range n + 1 {
		node := nodes[i%2]
		sb := store.Sandbox{ID: store.NewID("sbx_"), AccountID: acct.ID, NodeID: fmt.Sprintf("node-%d", i%2), Status: store.SandboxRunning, Runtime: "gvisor",
			Volumes: []store.VolumeAttachment{{VolumeID: v.ID, Path: "/data"}}}
		if err := st.CreateSandbox(ctx, &sb); err != nil {
			return nil, 0, err
		}
		var spec runtime.Spec
		start := time.Now()
		if err := node.Prestart(ctx, sb, &spec); err != nil {
			return nil, 0, err
		}
		if i > 0 {
			fetches = append(fetches, time.Since(start))
		} else if err := host.CopySparse(img, spec.Volumes[0].Image, 0o600); err != nil {
			// The first writer's data: the server's volume.
			return nil, 0, err
		}
		if _, err := st.TransitionSandbox(ctx, sb.ID, []store.SandboxStatus{store.SandboxRunning}, store.SandboxStopped, "", time.Now()); err != nil {
			return nil, 0, err
		}
		start = time.Now()
		if err := node.Stop(ctx, sb.ID); err != nil {
			return nil, 0, err
		}
		if i < n {
			syncs = append(syncs, time.Since(start))
		}
	}
	cur, err := st.GetVolume(ctx, v.ID)
	if err != nil {
		return nil, 0, err
	}
	info, err := blobs.Stat(ctx, cur.BlobKey)
	if err != nil {
		return nil, 0, err
	}
	return []VolumesCase{
		{Name: "sandboxd: sync to the blob store as the writer ends (its data extents, zstd)", Latency: latency(syncs, n)},
		{Name: "sandboxd: fetch from the blob store as a sandbox on another node starts", Latency: latency(fetches, n)},
	}, info.Size, nil
}

// syncFile fsyncs the file at path.
func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// createStopLater creates a sandbox of body and answers its id once it
// runs.
func (s *ttiServer) createStopLater(ctx context.Context, key string, body map[string]any) (string, error) {
	var c created
	b := map[string]any{"timeout": 3_600_000}
	for k, v := range body {
		b[k] = v
	}
	if _, err := s.call(ctx, key, http.MethodPost, "/api/sandboxes", b, &c); err != nil {
		return "", err
	}
	if len(c.Sandboxes) == 0 {
		return "", fmt.Errorf("create answered no sandbox")
	}
	return c.Sandboxes[0].SandboxID, nil
}

func (s *ttiServer) stopSandbox(ctx context.Context, key, id string) error {
	_, err := s.call(ctx, key, http.MethodPost, "/api/sandboxes/"+id+"/stop", map[string]any{}, nil)
	return err
}

// exec runs script in sandbox id and answers its output; a status other
// than 0 is an error.
func (s *ttiServer) exec(ctx context.Context, key, id, script string) (string, error) {
	var out struct {
		ExitCode int    `json:"exitCode"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	}
	if _, err := s.call(ctx, key, http.MethodPost, "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", script}}, &out); err != nil {
		return "", err
	}
	if out.ExitCode != 0 {
		return "", fmt.Errorf("%q exited %d: %s", script, out.ExitCode, out.Stderr)
	}
	return out.Stdout, nil
}
