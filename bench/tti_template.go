package bench

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The custom template case of `bench tti`: a template built through the
// API from an OCI image, then created from as the built-in image is, in
// the same run, so that its figures sit next to the built-in's and the
// bare runtime's. By default the image is the served root filesystem
// itself, as one uncompressed layer, pushed to a registry the benchmark
// serves on loopback (the server it starts allows private registries):
// the same files as the built-in image, so what differs is only how a
// sandbox of a custom template is started.

// customTemplateName is the template the benchmark builds.
const customTemplateName = "bench-custom:latest"

// minTemplatePool is the size the server gives a template's pool after
// its first create (internal/sandbox's minTemplatePool), with a budget of
// at least that.
const minTemplatePool = 2

// TTITemplate says which custom template was measured and how long its
// build took.
type TTITemplate struct {
	// Image is the reference built (a loopback registry's for the
	// served root filesystem).
	Image string `json:"image"`
	// ImageMiB is the size of the layer pushed (0 for a given image).
	ImageMiB float64 `json:"image_mib,omitempty"`
	// BuildMs is from the build's request to the template being ready.
	BuildMs float64 `json:"build_ms"`
	// Pool is the server's --template-pool ("" for its default).
	Pool string `json:"template_pool,omitempty"`
}

// buildCustomTemplate serves the custom image (unless o.CustomImage names
// one) and builds it into a template of the account; it returns the
// template's description and a stop for the registry.
func (s *ttiServer) buildCustomTemplate(ctx context.Context, key string, o TTIOptions) (TTITemplate, func(), error) {
	tt := TTITemplate{Image: o.CustomImage, Pool: o.TemplatePool}
	stop := func() {}
	if tt.Image == "" {
		ref, size, stopReg, err := serveRootfsImage(ctx, filepath.Join(o.StateDir, "registry"), o.CustomRootfs)
		if err != nil {
			return tt, stop, fmt.Errorf("serve the custom image: %w", err)
		}
		tt.Image, tt.ImageMiB, stop = ref, round(float64(size)/(1<<20)), stopReg
	}
	start := time.Now()
	var built struct {
		Template struct {
			ID string `json:"id"`
		} `json:"template"`
	}
	if _, err := s.call(ctx, key, http.MethodPost, "/api/templates", map[string]any{"name": customTemplateName, "image": tt.Image}, &built); err != nil {
		return tt, stop, err
	}
	for {
		var got struct {
			Template struct {
				Status        string `json:"status"`
				FailureReason string `json:"failureReason"`
			} `json:"template"`
		}
		if _, err := s.call(ctx, key, http.MethodGet, "/api/templates/"+built.Template.ID, nil, &got); err != nil {
			return tt, stop, err
		}
		switch got.Template.Status {
		case "ready":
			tt.BuildMs = ms(time.Since(start))
			return tt, stop, nil
		case "failed":
			return tt, stop, fmt.Errorf("the custom template's build failed: %s", got.Template.FailureReason)
		}
		if time.Since(start) > 30*time.Minute {
			return tt, stop, errors.New("the custom template was not built in 30 minutes")
		}
		select {
		case <-ctx.Done():
			return tt, stop, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// templatePoolFill is what the server's custom templates' pool holds
// after a template's first create: minTemplatePool within the budget.
func (o TTIOptions) templatePoolFill() int {
	budget := 4 // serve's default
	if n, err := strconv.Atoi(o.TemplatePool); err == nil {
		budget = n
	}
	return min(budget, minTemplatePool)
}

// waitPoolReady waits until the server's custom templates' pools hold n
// started sandboxes, at most a minute.
func (s *ttiServer) waitPoolReady(ctx context.Context, n int) error {
	return s.waitPool(ctx, "template", n, time.Minute)
}

// waitPool waits until the server's pool (builtin or template) holds n
// started sandboxes (sandboxd_pool_ready), at most wait.
func (s *ttiServer) waitPool(ctx context.Context, pool string, n int, wait time.Duration) error {
	want := `sandboxd_pool_ready{pool="` + pool + `"} `
	deadline := time.Now().Add(wait)
	for {
		ready := -1.0
		if req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.metrics+"/metrics", nil); err == nil {
			if resp, err := s.http.Do(req); err == nil {
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					if v, ok := strings.CutPrefix(sc.Text(), want); ok {
						ready, _ = strconv.ParseFloat(v, 64)
					}
				}
				resp.Body.Close()
			}
		}
		if ready >= float64(n) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the %s pool holds %v sandboxes after %v, not %d", pool, ready, wait, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// serveRootfsImage serves, from a registry on loopback whose blobs are in
// dir, an image of rootfs as one uncompressed layer (written to dir
// first: the full image is gigabytes), and returns its reference.
func serveRootfsImage(ctx context.Context, dir, rootfs string) (ref string, size int64, stop func(), err error) {
	if err := os.MkdirAll(filepath.Join(dir, "blobs"), 0o700); err != nil {
		return "", 0, nil, err
	}
	layer, err := writeRootfsLayer(rootfs, filepath.Join(dir, "layer.tar"))
	if err != nil {
		return "", 0, nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return "", 0, nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", 0, nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goruntime.GOARCH
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", 0, nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", 0, nil, err
	}
	srv := &http.Server{
		Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0)), registry.WithBlobHandler(registry.NewDiskBlobHandler(filepath.Join(dir, "blobs")))),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	stop = func() { _ = srv.Close() }
	r, err := name.ParseReference(ln.Addr().String()+"/bench/custom:latest", name.Insecure)
	if err == nil {
		err = remote.Write(r, img, remote.WithContext(ctx))
	}
	if err != nil {
		stop()
		return "", 0, nil, fmt.Errorf("push the image: %w", err)
	}
	// The layer is in the registry's blobs now.
	_ = os.Remove(filepath.Join(dir, "layer.tar"))
	return r.String(), layer.size, stop, nil
}

// fileLayer is an uncompressed layer in a file: its digest is its diff
// id.
type fileLayer struct {
	path string
	hash v1.Hash
	size int64
}

func (l *fileLayer) Digest() (v1.Hash, error)             { return l.hash, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)             { return l.hash, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)   { return os.Open(l.path) }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) { return os.Open(l.path) }
func (l *fileLayer) Size() (int64, error)                 { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error)  { return types.OCIUncompressedLayer, nil }

// writeRootfsLayer writes rootfs as a tar to path, hashing it: its files,
// directories, symlinks (as written) and hard links, with their modes,
// owners and times; device nodes, sockets and pipes are left out (a
// runtime gives a sandbox its own /dev).
func writeRootfsLayer(rootfs, path string) (*fileLayer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	tw := tar.NewWriter(cw)
	links := map[[2]uint64]string{} // (dev, inode) of files with more than one link → first name
	err = filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == rootfs {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch m := fi.Mode(); {
		case m&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeSocket|fs.ModeNamedPipe|fs.ModeIrregular) != 0:
			return nil
		}
		rel, err := filepath.Rel(rootfs, p)
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uname, hdr.Gname = filepath.ToSlash(rel), "", ""
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
			id := [2]uint64{uint64(st.Dev), st.Ino}
			if first, ok := links[id]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[id] = hdr.Name
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		if _, err := io.CopyN(tw, src, hdr.Size); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = f.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("write the image's layer: %w", err)
	}
	return &fileLayer{path: path, hash: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}, size: cw.n}, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
