package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/guest"
)

func errResult(err error) guest.Result {
	kind := guest.KindOther
	switch {
	case isNotFound(err):
		kind = guest.KindNotFound
	case isDirErr(err):
		kind = guest.KindIsDir
	}
	return guest.Result{Error: err.Error(), ErrorKind: kind}
}

func fileInfo(name string, fi fs.FileInfo, link string) guest.FileInfo {
	return guest.FileInfo{Name: name, Size: fi.Size(), Mode: uint32(fi.Mode()), ModTime: fi.ModTime().UTC(), Link: link}
}

// readFile streams path to the host: Header, Data..., End.
func (a *Agent) readFile(w *frameWriter, path string) {
	f, err := os.Open(path)
	if err != nil {
		_ = w.json(guest.FrameResult, errResult(err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		_ = w.json(guest.FrameResult, errResult(err))
		return
	}
	if fi.IsDir() {
		_ = w.json(guest.FrameResult, errResult(&fs.PathError{Op: "read", Path: path, Err: errIsDir}))
		return
	}
	if err := w.json(guest.FrameHeader, fileInfo(filepath.Base(path), fi, "")); err != nil {
		return
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if w.frame(guest.FrameData, buf[:n]) != nil {
				return
			}
		}
		if err == io.EOF {
			_ = w.json(guest.FrameEnd, guest.End{})
			return
		}
		if err != nil {
			_ = w.json(guest.FrameEnd, guest.End{Error: err.Error()})
			return
		}
	}
}

// writeFile receives Data... End from the host into a temporary file next
// to path and renames it into place, so readers never see a partial file.
func (a *Agent) writeFile(r io.Reader, w *frameWriter, path string, mode uint32) {
	if !filepath.IsAbs(path) {
		_ = w.json(guest.FrameResult, guest.Result{Error: "path must be absolute", ErrorKind: guest.KindOther})
		return
	}
	perm := fs.FileMode(mode).Perm()
	if perm == 0 {
		perm = 0o644
		if fi, err := os.Stat(path); err == nil {
			perm = fi.Mode().Perm()
		}
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		_ = w.json(guest.FrameResult, errResult(err))
		return
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".sandboxd-*")
	if err != nil {
		_ = w.json(guest.FrameResult, errResult(err))
		return
	}
	fail := func(err error) {
		tmp.Close()
		os.Remove(tmp.Name())
		_ = w.json(guest.FrameResult, errResult(err))
	}
	var size int64
	var writeErr error
	for {
		t, payload, err := guest.ReadFrame(r)
		if err != nil {
			// The host went away mid-upload: nothing to answer.
			tmp.Close()
			os.Remove(tmp.Name())
			return
		}
		if t == guest.FrameData {
			if writeErr == nil {
				n, err := tmp.Write(payload)
				size += int64(n)
				writeErr = err
			}
			continue
		}
		if t != guest.FrameEnd {
			fail(fmt.Errorf("%w: frame %d in upload", guest.ErrProtocol, t))
			return
		}
		var e guest.End
		if err := json.Unmarshal(payload, &e); err != nil {
			fail(err)
			return
		}
		if e.Error != "" {
			fail(fmt.Errorf("upload aborted: %s", e.Error))
			return
		}
		break
	}
	if writeErr != nil {
		fail(writeErr)
		return
	}
	if err := tmp.Chmod(perm); err != nil {
		fail(err)
		return
	}
	if err := tmp.Close(); err != nil {
		fail(err)
		return
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		_ = w.json(guest.FrameResult, errResult(err))
		return
	}
	_ = w.json(guest.FrameResult, guest.Result{Size: size})
}

// listDir lists path's entries without following symlinks.
// listDir lists path: at most guest.MaxListEntries entries, and no more
// than fit in one frame, sorted by name. A bigger directory is listed in
// part (the host refuses more).
func listDir(path string) guest.Result {
	d, err := os.Open(path)
	if err != nil {
		return errResult(err)
	}
	defer d.Close()
	ents, err := d.ReadDir(guest.MaxListEntries)
	if err != nil && !errors.Is(err, io.EOF) {
		return errResult(err)
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	out := make([]guest.FileInfo, 0, len(ents))
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue // removed while listing
		}
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			link, _ = os.Readlink(filepath.Join(path, e.Name()))
		}
		out = append(out, fileInfo(e.Name(), fi, link))
	}
	// Long names and links may not fit in one frame: cut until they do.
	for len(out) > 0 {
		b, err := json.Marshal(guest.Result{Entries: out})
		if err == nil && len(b) <= guest.MaxFrame {
			break
		}
		out = out[:len(out)*3/4]
	}
	return guest.Result{Entries: out}
}

func (a *Agent) health() guest.Health {
	h := guest.Health{Uptime: time.Since(a.start).Seconds(), Processes: len(listProcs())}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "MemTotal:":
				h.MemTotal = kb << 10
			case "MemAvailable:":
				h.MemFree = kb << 10
			}
		}
	}
	return h
}
