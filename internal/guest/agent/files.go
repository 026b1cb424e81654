package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sandboxd/sandboxd/internal/guest"
	pb "github.com/sandboxd/sandboxd/internal/guest/pb/filesystem"
	agentv1 "github.com/sandboxd/sandboxd/internal/guest/pb/sandboxd/agent/v1"
)

// maxListDepth bounds ListDir's depth.
const maxListDepth = 16

// abs resolves a path from the host: absolute as given, relative to HOME
// (envd's rule) otherwise: u's home when the request acts as u.
func (a *Agent) abs(path string, u *account) (string, error) {
	if path == "" {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("empty path"))
	}
	if strings.ContainsRune(path, 0) {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("path contains NUL"))
	}
	if !filepath.IsAbs(path) {
		home := envValue(a.opts.Env, "HOME")
		if u != nil {
			home = u.home
		}
		if home == "" {
			home = "/"
		}
		path = filepath.Join(home, path)
	}
	return filepath.Clean(path), nil
}

// fsError is the Connect error for a filesystem error.
func fsError(err error) error {
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return err
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// owners names uids and gids, remembering what it looked up.
type owners struct {
	mu     sync.Mutex
	users  map[uint32]string
	groups map[uint32]string
}

func (o *owners) names(uid, gid uint32) (string, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.users == nil {
		o.users, o.groups = map[uint32]string{}, map[uint32]string{}
	}
	u, ok := o.users[uid]
	if !ok {
		u = strconv.FormatUint(uint64(uid), 10)
		if x, err := user.LookupId(u); err == nil {
			u = x.Username
		}
		o.users[uid] = u
	}
	g, ok := o.groups[gid]
	if !ok {
		g = strconv.FormatUint(uint64(gid), 10)
		if x, err := user.LookupGroupId(g); err == nil {
			g = x.Name
		}
		o.groups[gid] = g
	}
	return u, g
}

// entry describes path (not following a final symlink). envd asks for
// envd's answer (guest.EnvdHeader): a symbolic link is described by its
// resolved target (type, mode) with that target's absolute path, and the
// mode is the permission bits alone.
func (a *Agent) entry(path string, fi fs.FileInfo, envd bool) *pb.EntryInfo {
	e := &pb.EntryInfo{
		Name: fi.Name(), Path: path, Size: fi.Size(), Mode: uint32(fi.Mode()), Permissions: fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0 && envd:
		// envd's: the target fully resolved (the link's own path when it
		// cannot be), typed and moded as that target; unknown when broken.
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			target = path
		}
		e.SymlinkTarget = &target
		e.Type, e.Mode = pb.FileType_FILE_TYPE_UNSPECIFIED, 0
		if ti, err := os.Stat(target); err == nil {
			e.Type, e.Mode = fileType(ti), uint32(ti.Mode().Perm())
		}
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = pb.FileType_FILE_TYPE_SYMLINK
		if t, err := os.Readlink(path); err == nil {
			e.SymlinkTarget = &t
		}
	default:
		e.Type = fileType(fi)
		if envd {
			e.Mode = uint32(fi.Mode().Perm())
		}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner, e.Group = a.owners.names(st.Uid, st.Gid)
	}
	if envd {
		// envd's user metadata (it reads as the caller: see metadata.go).
		e.Metadata = readMetadata(path)
	}
	return e
}

// fileType is fi's type as the filesystem API names it.
func fileType(fi fs.FileInfo) pb.FileType {
	switch {
	case fi.IsDir():
		return pb.FileType_FILE_TYPE_DIRECTORY
	case fi.Mode().IsRegular():
		return pb.FileType_FILE_TYPE_FILE
	case fi.Mode()&fs.ModeSymlink != 0:
		return pb.FileType_FILE_TYPE_SYMLINK
	default:
		return pb.FileType_FILE_TYPE_UNSPECIFIED
	}
}

// envdAnswers says whether the request asks for envd's answers.
func envdAnswers(h http.Header) bool { return h.Get(guest.EnvdHeader) != "" }

// filesystemService is the filesystem API (envd's), served to the host.
type filesystemService struct{ a *Agent }

func (s filesystemService) Stat(_ context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	u, err := s.a.requestUser(req.Header())
	if err != nil {
		return nil, err
	}
	path, err := s.a.abs(req.Msg.GetPath(), u)
	if err != nil {
		return nil, err
	}
	resp := &pb.StatResponse{}
	err = asUser(u, func() error {
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		resp.Entry = s.a.entry(path, fi, envdAnswers(req.Header()))
		return nil
	})
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(resp), nil
}

// MakeDir, Move and Remove run whole as the user (asUser): the parents
// they make are the user's as the kernel makes them (its gid, or the
// parent's group in a setgid directory), and a directory the user may not
// write to, or a symlink into one, stops them with a permission error.
func (s filesystemService) MakeDir(_ context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	u, err := s.a.requestUser(req.Header())
	if err != nil {
		return nil, err
	}
	path, err := s.a.abs(req.Msg.GetPath(), u)
	if err != nil {
		return nil, err
	}
	resp := &pb.MakeDirResponse{}
	err = asUser(u, func() error {
		if fi, err := os.Lstat(path); err == nil {
			if fi.IsDir() {
				return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s exists", path))
			}
			return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s exists and is not a directory", path))
		}
		if err := os.MkdirAll(path, 0o755); err != nil {
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		resp.Entry = s.a.entry(path, fi, envdAnswers(req.Header()))
		return nil
	})
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(resp), nil
}

func (s filesystemService) Move(_ context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	u, err := s.a.requestUser(req.Header())
	if err != nil {
		return nil, err
	}
	src, err := s.a.abs(req.Msg.GetSource(), u)
	if err != nil {
		return nil, err
	}
	dst, err := s.a.abs(req.Msg.GetDestination(), u)
	if err != nil {
		return nil, err
	}
	resp := &pb.MoveResponse{}
	err = asUser(u, func() error {
		// The moved entry keeps its owner; parents made for it are u's.
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.Rename(src, dst); err != nil {
			return err
		}
		fi, err := os.Lstat(dst)
		if err != nil {
			return err
		}
		resp.Entry = s.a.entry(dst, fi, envdAnswers(req.Header()))
		return nil
	})
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(resp), nil
}

func (s filesystemService) Remove(_ context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	u, err := s.a.requestUser(req.Header())
	if err != nil {
		return nil, err
	}
	path, err := s.a.abs(req.Msg.GetPath(), u)
	if err != nil {
		return nil, err
	}
	if path == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("will not remove /"))
	}
	err = asUser(u, func() error {
		if _, err := os.Lstat(path); err != nil {
			if errors.Is(err, fs.ErrNotExist) && envdAnswers(req.Header()) {
				return nil // envd's remove is os.RemoveAll's: nothing there is done
			}
			return err
		}
		return os.RemoveAll(path)
	})
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

// ListDir lists path to the depth asked (1: its entries), without
// following symlinks, sorted by path: at most guest.MaxListEntries entries
// and no more than fit in one message (a bigger tree is listed in part).
func (s filesystemService) ListDir(_ context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	u, err := s.a.requestUser(req.Header())
	if err != nil {
		return nil, err
	}
	root, err := s.a.abs(req.Msg.GetPath(), u)
	if err != nil {
		return nil, err
	}
	depth := min(max(int(req.Msg.GetDepth()), 1), maxListDepth)
	envd := envdAnswers(req.Header())
	var out []*pb.EntryInfo
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		d, err := os.Open(dir)
		if err != nil {
			return err
		}
		ents, err := d.ReadDir(guest.MaxListEntries - len(out))
		d.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
		for _, e := range ents {
			if len(out) >= guest.MaxListEntries {
				return nil
			}
			info, err := e.Info()
			if err != nil {
				continue // removed while listing
			}
			p := filepath.Join(dir, e.Name())
			out = append(out, s.a.entry(p, info, envd))
			if info.IsDir() && level < depth {
				// A subdirectory that cannot be read is listed, not entered.
				_ = walk(p, level+1)
			}
		}
		return nil
	}
	// As the user: what it may not read or enter is not listed.
	err = asUser(u, func() error {
		fi, err := os.Stat(root)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return &fs.PathError{Op: "list", Path: root, Err: syscall.ENOTDIR}
		}
		return walk(root, 1)
	})
	if err != nil {
		return nil, fsError(err)
	}
	// Long names and links may not fit in one message: cut until they do.
	resp := &pb.ListDirResponse{Entries: out}
	for len(resp.Entries) > 0 && proto.Size(resp) > guest.MaxMessage-1024 {
		resp.Entries = resp.Entries[:len(resp.Entries)*3/4]
	}
	return connect.NewResponse(resp), nil
}

// fileError answers a /files request with envd's error body and the kind
// the host maps to a typed error.
func fileError(w http.ResponseWriter, err error) {
	code, kind := http.StatusInternalServerError, guest.KindOther
	var bad *badUserError
	var req *requestError
	var ce *connect.Error
	switch {
	case errors.As(err, &bad):
		code, err = http.StatusBadRequest, bad
	case errors.Is(err, errTooLarge):
		code = http.StatusRequestEntityTooLarge
	case errors.As(err, &req):
		code = http.StatusBadRequest
	case errors.As(err, &ce) && ce.Code() == connect.CodeInvalidArgument:
		code, err = http.StatusBadRequest, errors.New(ce.Message()) // abs's
	case errors.Is(err, fs.ErrNotExist):
		code, kind = http.StatusNotFound, guest.KindNotFound
	case errors.Is(err, syscall.EISDIR):
		code, kind = http.StatusBadRequest, guest.KindIsDir
	case errors.Is(err, fs.ErrPermission):
		// envd, which does the work as root, has no such answer; 403 is
		// what the user's permissions refused (PermissionDenied in fsError).
		code = http.StatusForbidden
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		code = http.StatusInsufficientStorage
	}
	w.Header().Set(guest.ErrorKindHeader, kind)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": code, "message": err.Error()})
}

// getFile streams a file's bytes. Acting as a user, the file is opened on
// its thread (asUser), where the kernel checks the user's right to read
// it and resolves the path as the user; the open file is then streamed
// from here, as reading an open file checks nothing more.
//
// Accept-Encoding is not honoured: the body is always the file as it is
// (identity, which every client accepts); the e2b SDK's read with gzip
// gets it so and reads it as it is.
func (a *Agent) getFile(w http.ResponseWriter, r *http.Request) {
	u, err := a.requestUser(r.Header)
	if err != nil {
		fileError(w, err)
		return
	}
	path, err := a.abs(r.URL.Query().Get("path"), u)
	if err != nil {
		fileError(w, err)
		return
	}
	var f *os.File
	var fi fs.FileInfo
	err = asUser(u, func() error {
		var err error
		if f, err = os.Open(path); err != nil {
			return err
		}
		if fi, err = f.Stat(); err != nil {
			f.Close()
		}
		return err
	})
	if err != nil {
		fileError(w, err)
		return
	}
	defer f.Close()
	if fi.IsDir() {
		fileError(w, &fs.PathError{Op: "read", Path: path, Err: syscall.EISDIR})
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Last-Modified", fi.ModTime().UTC().Format(http.TimeFormat))
	// No Content-Length: the size stat reports is not what a read returns
	// for /proc and /sys files (4096 for a few bytes), nor for a file that
	// changes meanwhile.
	if _, err := io.Copy(w, f); err != nil {
		// Reset the stream: the host must see a broken transfer, not a
		// short file.
		panic(http.ErrAbortHandler)
	}
}

func (a *Agent) health() *agentv1.HealthResponse {
	h := &agentv1.HealthResponse{UptimeSeconds: time.Since(a.start).Seconds(), Processes: uint32(len(listProcs()))}
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
