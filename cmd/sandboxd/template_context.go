package main

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/dustin/go-humanize"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// A Dockerfile's build context (`template build --dockerfile F --context
// DIR`): DIR is packed into a gzipped tar (packContext, without what its
// .dockerignore names), uploaded under the archive's SHA-256 unless the
// account has it already (PUT /api/templates/files/{hash}), and named in
// the build's "context". The archive is reproducible — entries sorted,
// times, owners and gzip header left out — so that an unchanged DIR has
// the same hash, is not uploaded again, and keeps the COPY steps' cache.

// contextArchive is a packed context: a temporary file.
type contextArchive struct {
	file         *os.File
	hash         string
	size         int64
	files, bytes int64
}

func (a *contextArchive) Close() {
	a.file.Close()
	os.Remove(a.file.Name())
}

// packContext packs dir into a temporary gzipped tar.
func packContext(dir string) (*contextArchive, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", dir)
	}
	ignore, err := readDockerignore(filepath.Join(dir, ".dockerignore"))
	if err != nil {
		return nil, err
	}
	var paths []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if ignore.excludes(rel) {
			if d.IsDir() && !ignore.hasExceptions() {
				return filepath.SkipDir
			}
			return nil
		}
		paths = append(paths, rel)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	f, err := os.CreateTemp("", "sandboxd-context-*.tar.gz")
	if err != nil {
		return nil, err
	}
	a := &contextArchive{file: f}
	h := sha256.New()
	bw := bufio.NewWriter(io.MultiWriter(f, h))
	zw, _ := gzip.NewWriterLevel(bw, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	if err := a.add(tw, dir, paths); err != nil {
		a.Close()
		return nil, err
	}
	for _, c := range []io.Closer{tw, zw} {
		if err := c.Close(); err != nil {
			a.Close()
			return nil, err
		}
	}
	if err := bw.Flush(); err != nil {
		a.Close()
		return nil, err
	}
	if a.size, err = f.Seek(0, io.SeekCurrent); err != nil {
		a.Close()
		return nil, err
	}
	a.hash = hex.EncodeToString(h.Sum(nil))
	return a, nil
}

// add writes the entries of paths (relative to dir, slash-separated):
// files with their bytes and permission bits, directories, symbolic
// links as links. A link to an absolute path or out of dir is refused
// here as the server would refuse it.
func (a *contextArchive) add(tw *tar.Writer, dir string, paths []string) error {
	for _, rel := range paths {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: rel, Mode: int64(fi.Mode().Perm())}
		switch {
		case fi.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		case fi.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			target = filepath.ToSlash(target)
			if path.IsAbs(target) || strings.HasPrefix(path.Join(path.Dir(rel), target), "..") {
				return fmt.Errorf("%s is a link to %s, outside the context: the server refuses it (list it in .dockerignore)", rel, target)
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		default:
			continue // sockets, pipes, devices: not build files
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			n, err := io.Copy(tw, io.LimitReader(f, hdr.Size))
			f.Close()
			if err != nil {
				return err
			}
			if n != hdr.Size {
				return fmt.Errorf("%s changed while it was packed", rel)
			}
			a.files++
			a.bytes += n
		}
	}
	return nil
}

// dockerignore is a .dockerignore's patterns, in order: a path is left
// out when the last pattern that matches it is not an exception ("!").
// Patterns are path.Match's on the path or one of its parent directories,
// after a leading "/" or "./"; "**/" before a pattern matches at any depth.
type dockerignore struct{ rules []ignoreRule }

type ignoreRule struct {
	pattern   string
	exception bool
}

func readDockerignore(name string) (dockerignore, error) {
	var d dockerignore
	b, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return d, nil
	}
	if err != nil {
		return d, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r := ignoreRule{}
		if strings.HasPrefix(line, "!") {
			r.exception, line = true, strings.TrimSpace(line[1:])
		}
		line = path.Clean(strings.TrimPrefix(strings.TrimPrefix(line, "./"), "/"))
		if _, err := path.Match(line, ""); err != nil {
			return d, fmt.Errorf(".dockerignore: bad pattern %q", line)
		}
		r.pattern = line
		d.rules = append(d.rules, r)
	}
	return d, nil
}

func (d dockerignore) hasExceptions() bool {
	for _, r := range d.rules {
		if r.exception {
			return true
		}
	}
	return false
}

// excludes reports whether rel is left out of the context. The
// .dockerignore itself is kept out of nothing, as Docker does.
func (d dockerignore) excludes(rel string) bool {
	out := false
	for _, r := range d.rules {
		if matchIgnore(r.pattern, rel) {
			out = !r.exception
		}
	}
	return out
}

// matchIgnore matches pattern against rel or one of its parents.
func matchIgnore(pattern, rel string) bool {
	anyDepth := strings.HasPrefix(pattern, "**/")
	pattern = strings.TrimPrefix(pattern, "**/")
	parts := strings.Split(rel, "/")
	for end := 1; end <= len(parts); end++ {
		starts := []int{0}
		if anyDepth {
			starts = starts[:0]
			for s := 0; s < end; s++ {
				starts = append(starts, s)
			}
		}
		for _, s := range starts {
			if ok, _ := path.Match(pattern, strings.Join(parts[s:end], "/")); ok {
				return true
			}
		}
	}
	return false
}

// templateFiles is GET /api/templates/files/{hash}.
func (c *apiClient) templateFiles(ctx context.Context, hash string) (bool, error) {
	var out struct {
		Present bool `json:"present"`
	}
	err := c.rawCall(ctx, http.MethodGet, "/api/templates/files/"+hash, nil, -1, &out)
	return out.Present, err
}

// putTemplateFiles is PUT /api/templates/files/{hash} of the archive.
func (c *apiClient) putTemplateFiles(ctx context.Context, a *contextArchive, progress io.Writer) error {
	if _, err := a.file.Seek(0, io.SeekStart); err != nil {
		return err
	}
	body := &countingReader{r: a.file, total: a.size, w: progress}
	return c.rawCall(ctx, http.MethodPut, "/api/templates/files/"+a.hash, body, a.size, nil)
}

// rawCall is a call of a route the generated client does not have yet:
// the API's key, its error body as a *client.Error.
func (c *apiClient) rawCall(ctx context.Context, method, p string, body io.Reader, size int64, out any) error {
	u, err := url.JoinPath(c.url, p)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	if size >= 0 {
		req.ContentLength = size
		req.Header.Set("Content-Type", "application/x-tar")
	}
	req.Header.Set("x-api-key", c.key)
	resp, err := namedErrors{c.http}.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := &client.Error{StatusCode: resp.StatusCode}
		_ = json.Unmarshal(b, &e.Body)
		return e
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("decode answer: %w", err)
		}
	}
	return nil
}

// countingReader reports an upload's progress to w (nil: none), a line
// at each tenth.
type countingReader struct {
	r           io.Reader
	total, done int64
	tenth       int64
	w           io.Writer
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.done += int64(n)
	if c.w != nil && c.total > 0 {
		if t := c.done * 10 / c.total; t > c.tenth {
			c.tenth = t
			fmt.Fprintf(c.w, "sandboxd: uploaded %s of %s\n", humanize.IBytes(uint64(c.done)), humanize.IBytes(uint64(c.total)))
		}
	}
	return n, err
}

// uploadContext packs dir and uploads it unless the account has it,
// returning its hash; progress lines go to progress (nil: none).
func (c *apiClient) uploadContext(ctx context.Context, dir string, progress io.Writer) (string, error) {
	a, err := packContext(dir)
	if err != nil {
		return "", fmt.Errorf("--context: %w", err)
	}
	defer a.Close()
	say := func(format string, args ...any) {
		if progress != nil {
			fmt.Fprintf(progress, "sandboxd: "+format+"\n", args...)
		}
	}
	say("context %s: %d files, %s, packed into %s (sha256 %s)", dir, a.files, humanize.IBytes(uint64(a.bytes)), humanize.IBytes(uint64(a.size)), a.hash[:12])
	present, err := c.templateFiles(ctx, a.hash)
	if err != nil {
		return "", err
	}
	if present {
		say("context already uploaded")
		return a.hash, nil
	}
	if err := c.putTemplateFiles(ctx, a, progress); err != nil {
		return "", err
	}
	return a.hash, nil
}

// postTemplateWithContext is POST /api/templates with "context" (a field
// the generated client does not have yet).
func (c *apiClient) postTemplateWithContext(ctx context.Context, body client.BuildTemplateRequest, hash string) (*client.PostTemplatesResult, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	m["context"], _ = json.Marshal(hash)
	if b, err = json.Marshal(m); err != nil {
		return nil, err
	}
	cl, err := c.api()
	if err != nil {
		return nil, err
	}
	return client.Check(cl.PostTemplatesWithBodyWithResponse(ctx, "application/json", strings.NewReader(string(b))))
}
