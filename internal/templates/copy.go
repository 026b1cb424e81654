package templates

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/filecopy"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// A COPY step (Docker's and E2B's rules):
//
//   - Src is a path or a glob (path.Match, on whole paths) in the account's
//     upload named FilesHash; "." is all of it. What it matches are its
//     roots: a directory root's contents go into Dest, a file root (or a
//     link) becomes Dest/<its name> when Dest is a directory (it ends in
//     "/", more than one root matched, a root is a directory, or Dest is a
//     directory in the sandbox already), else Dest itself.
//   - Dest is taken from the current WORKDIR when relative; it and its
//     parents are made when missing.
//   - The files are written by the build sandbox's agent as root
//     (filecopy.Extract: every path resolved inside the sandbox), then
//     links are made and owners and modes set by commands in the sandbox
//     (ln, chown, chmod, as root). The owner is User — "user[:group]"; a
//     name without a group takes the user's primary group, a number
//     without one the same number — filled in before the cache keys are
//     computed (ownerDefaults): the current USER for a JSON step (E2B's
//     rule), root for a Dockerfile's (Docker's). Mode, when not 0, is set
//     on every file and directory copied (links aside); else files keep
//     their permission bits (set-id and sticky bits dropped) and
//     directories theirs.

// copyRoot is what a COPY's source matched.
type copyRoot struct {
	name string // "" for the whole upload
	dir  bool
}

// copyPlan is what one COPY writes, worked out from the archive before a
// byte of it is written.
type copyPlan struct {
	src   string
	roots []copyRoot
	index map[string]int // root name -> its place in roots
}

// hasGlob reports whether a source is a pattern.
func hasGlob(s string) bool { return strings.ContainsAny(s, "*?[") }

// root is the root of the plan entry name falls under, if any.
func (p *copyPlan) root(name string) (string, bool) {
	src := path.Clean(p.src)
	if src == "." {
		return "", true
	}
	if !hasGlob(src) {
		if name == src || strings.HasPrefix(name, src+"/") {
			return src, true
		}
		return "", false
	}
	// The shortest leading path of name that the pattern matches.
	parts := strings.Split(name, "/")
	for i := 1; i <= len(parts); i++ {
		prefix := strings.Join(parts[:i], "/")
		if ok, _ := path.Match(src, prefix); ok {
			return prefix, true
		}
	}
	return "", false
}

// add records entry e in the plan.
func (p *copyPlan) add(e archiveEntry) {
	r, ok := p.root(e.Name)
	if !ok {
		return
	}
	dir := r == "" || e.Name != r || e.Type == tar.TypeDir
	if i, ok := p.index[r]; ok {
		p.roots[i].dir = p.roots[i].dir || dir
		return
	}
	p.index[r] = len(p.roots)
	p.roots = append(p.roots, copyRoot{name: r, dir: dir})
}

// planCopy reads the archive r and returns what src matches in it.
func planCopy(r io.Reader, lim archiveLimits, src string) (*copyPlan, error) {
	p := &copyPlan{src: src, index: map[string]int{}}
	if _, err := checkArchive(r, lim, func(e archiveEntry, _ io.Reader) error {
		p.add(e)
		return nil
	}); err != nil {
		return nil, err
	}
	if len(p.roots) == 0 {
		return nil, errdefs.Newf(errdefs.ErrInvalid, "%q matches nothing in the uploaded files", src)
	}
	return p, nil
}

// intoDir reports whether dest is a directory whatever the sandbox holds.
func (p *copyPlan) intoDir(dest string) bool {
	if strings.HasSuffix(dest, "/") || len(p.roots) > 1 {
		return true
	}
	return p.roots[0].dir
}

// target is where entry name goes, relative to the directory the copy
// writes into (the destination when it is a directory, else its parent,
// whose base name is destBase); "" for the destination directory itself;
// false for an entry the copy leaves out.
func (p *copyPlan) target(name string, intoDir bool, destBase string) (string, bool) {
	r, ok := p.root(name)
	if !ok {
		return "", false
	}
	root := p.roots[p.index[r]]
	if root.dir {
		if r == "" {
			return name, true
		}
		return strings.TrimPrefix(strings.TrimPrefix(name, r), "/"), true
	}
	if intoDir {
		return path.Base(r), true
	}
	return destBase, true
}

// copyFiles runs COPY step st (number n) in the build sandbox rsb.
func (r *stepRun) copyFiles(build context.Context, rsb runtime.Sandbox, n int, st templatespec.Step) error {
	s := r.s
	ctx, cancel := context.WithTimeout(build, s.cfg.StepTimeout)
	defer cancel()
	fail := func(err error) error {
		switch {
		case build.Err() != nil:
			return build.Err()
		case ctx.Err() != nil:
			return errdefs.Newf(nil, "step %d (COPY) took longer than %s", n, s.cfg.StepTimeout)
		}
		return errdefs.Wrap(nil, err, fmt.Sprintf("step %d (COPY %s): %s", n, clipLine(st.Src), errdefs.Message(err, "the files could not be copied")))
	}
	lim := s.archiveLimits()
	rc, err := s.openUpload(ctx, r.uploads[st.FilesHash])
	if err != nil {
		return fail(err)
	}
	plan, err := planCopy(rc, lim, st.Src)
	rc.Close()
	if err != nil {
		return fail(err)
	}
	fsys, err := s.filesOf(ctx, rsb)
	if err != nil {
		return fail(err)
	}
	dest := st.Dest
	if !path.IsAbs(dest) {
		dest = path.Join(r.workdir, dest)
	}
	dest = path.Clean(dest)
	intoDir := plan.intoDir(st.Dest)
	if !intoDir {
		if e, err := fsys.Stat(ctx, dest); err == nil && e.Mode.IsDir() {
			intoDir = true
		}
	}
	dir := dest
	if !intoDir {
		dir = path.Dir(dest)
	}
	_, err = fsys.Stat(ctx, dir)
	created := errors.Is(err, fs.ErrNotExist)

	w, err := r.writeCopy(ctx, fsys, st, plan, lim, dir, intoDir, path.Base(dest))
	if err != nil {
		return fail(err)
	}
	if created && intoDir {
		// The destination this COPY made is the files' owner's; it
		// takes the mode too when it stands for a source directory.
		w.madeDir = dir
		w.dirRoot = len(plan.roots) == 1 && plan.roots[0].dir
	}
	if err := r.finishCopy(ctx, rsb, st, w); err != nil {
		return fail(err)
	}
	r.logf("step %d: copied %d files, %d directories, %d links (%d bytes) to %s", n, w.files, w.dirs, len(w.links), w.bytes, dest)
	return nil
}

// copyWritten is what a copy wrote, for what is done after.
type copyWritten struct {
	files, dirs int
	bytes       int64
	// links are "ln -s" (symlinks) and "ln" (hard links) to make: target,
	// path pairs.
	links []link
	// all are the paths written, links included; chmodDirs the
	// directories by their archive mode.
	all       []string
	chmodDirs map[int64][]string
	// madeDir is the destination directory when the copy made it;
	// dirRoot says the copy is a directory's contents.
	madeDir string
	dirRoot bool
}

type link struct {
	hard         bool
	target, path string
}

// writeCopy streams the entries of the plan from the upload into dir
// through the agent (filecopy.Extract), renamed to their targets.
func (r *stepRun) writeCopy(ctx context.Context, fsys filecopy.FS, st templatespec.Step, plan *copyPlan, lim archiveLimits, dir string, intoDir bool, destBase string) (*copyWritten, error) {
	rc, err := r.s.openUpload(ctx, r.uploads[st.FilesHash])
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	w := &copyWritten{chmodDirs: map[int64][]string{}}
	targets := map[string]string{} // entry name -> its target, for hard links
	pr, pw := io.Pipe()
	produced := make(chan error, 1)
	go func() {
		tw := tar.NewWriter(pw)
		_, err := checkArchive(rc, lim, func(e archiveEntry, body io.Reader) error {
			rel, ok := plan.target(e.Name, intoDir, destBase)
			if !ok {
				return nil
			}
			abs := path.Join(dir, rel)
			targets[e.Name] = abs
			switch e.Type {
			case tar.TypeDir:
				if rel == "" {
					// The destination itself: its mode is the
					// sandbox's (made 0755 when new), never the
					// source's.
					return nil
				}
				w.dirs++
				if e.Mode&0o7777 != 0o755 {
					w.chmodDirs[e.Mode&0o7777] = append(w.chmodDirs[e.Mode&0o7777], abs)
				}
				w.all = append(w.all, abs)
				return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: rel + "/", Mode: 0o755})
			case tar.TypeReg:
				w.files++
				w.bytes += e.Size
				w.all = append(w.all, abs)
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: e.Mode & 0o777, Size: e.Size}); err != nil {
					return err
				}
				_, err := io.Copy(tw, body)
				return err
			case tar.TypeSymlink:
				w.links = append(w.links, link{target: e.Link, path: abs})
			case tar.TypeLink:
				t, ok := targets[e.Link]
				if !ok {
					return errdefs.Newf(errdefs.ErrInvalid, "%s is a hard link to %s, which this COPY does not copy", e.Name, e.Link)
				}
				w.links = append(w.links, link{hard: true, target: t, path: abs})
			}
			w.all = append(w.all, abs)
			return nil
		})
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
		produced <- err
	}()
	_, err = filecopy.Extract(ctx, fsys, dir, pr, filecopy.Limits{Bytes: lim.Bytes, Entries: lim.Entries})
	pr.CloseWithError(errors.New("the copy ended"))
	if perr := <-produced; perr != nil && !errors.Is(perr, io.ErrClosedPipe) {
		return nil, perr
	}
	if err != nil {
		return nil, err
	}
	return w, nil
}

// maxArgBytes bounds the paths of one command (ARG_MAX is far larger).
const maxArgBytes = 64 << 10

// finishCopy makes the links, then sets owners and modes, by commands
// run as root in the sandbox.
func (r *stepRun) finishCopy(ctx context.Context, rsb runtime.Sandbox, st templatespec.Step, w *copyWritten) error {
	if len(w.links) > 0 {
		// One shell per batch: target, path pairs as its arguments.
		const script = `while [ $# -gt 2 ]; do if [ "$1" = s ]; then ln -sfn -- "$2" "$3" || exit 1; else ln -f -- "$2" "$3" || exit 1; fi; shift 3; done`
		var args []string
		for _, l := range w.links {
			kind := "s"
			if l.hard {
				kind = "h"
			}
			args = append(args, kind, l.target, l.path)
		}
		if err := r.inBatches(ctx, rsb, []string{"/bin/sh", "-c", script, "sh"}, args, 3, "make links (ln)"); err != nil {
			return err
		}
	}
	if spec := chownSpec(st.User); spec != "" {
		paths := w.all
		if w.madeDir != "" {
			paths = append([]string{w.madeDir}, paths...)
		}
		if err := r.inBatches(ctx, rsb, []string{"chown", "-h", spec, "--"}, paths, 1, "set the owner "+st.User+" (chown)"); err != nil {
			return err
		}
	}
	if st.Mode != 0 {
		var paths []string
		if w.madeDir != "" && w.dirRoot {
			paths = append(paths, w.madeDir)
		}
		linked := map[string]bool{}
		for _, l := range w.links {
			linked[l.path] = !l.hard
		}
		for _, p := range w.all {
			if !linked[p] {
				paths = append(paths, p)
			}
		}
		return r.inBatches(ctx, rsb, []string{"chmod", fmt.Sprintf("%04o", uint32(st.Mode)), "--"}, paths, 1, "set the mode (chmod)")
	}
	for mode, dirs := range w.chmodDirs {
		if mode == 0o755 {
			continue
		}
		if err := r.inBatches(ctx, rsb, []string{"chmod", fmt.Sprintf("%04o", mode), "--"}, dirs, 1, "set directories' modes (chmod)"); err != nil {
			return err
		}
	}
	return nil
}

// inBatches runs cmd with args appended, as few times as maxArgBytes
// allows, group args at a time (never split).
func (r *stepRun) inBatches(ctx context.Context, rsb runtime.Sandbox, cmd, args []string, group int, what string) error {
	for len(args) > 0 {
		n, size := 0, 0
		for n < len(args) && (n == 0 || size < maxArgBytes) {
			for _, a := range args[n : n+group] {
				size += len(a) + 1
			}
			n += group
		}
		var out strings.Builder
		res, err := rsb.Exec(ctx, runtime.ExecRequest{Cmd: append(append([]string(nil), cmd...), args[:n]...), Cwd: "/",
			Stdout: &out, Stderr: &out, Timeout: r.s.cfg.StepTimeout})
		switch {
		case errors.Is(err, runtime.ErrCommandNotFound):
			return errdefs.Newf(nil, "could not %s: the image has no %s", what, cmd[0])
		case err != nil:
			return fmt.Errorf("%s: %w", what, err)
		case res.TimedOut:
			return errdefs.Newf(nil, "could not %s within %s", what, r.s.cfg.StepTimeout)
		case res.ExitCode != 0:
			msg := strings.TrimSpace(out.String())
			if len(msg) > 300 {
				msg = msg[:300] + "…"
			}
			return errdefs.Newf(nil, "could not %s: %s", what, msg)
		}
		args = args[n:]
	}
	return nil
}

// chownSpec is the owner argument of chown for a COPY's user, "" when the
// files stay root's (as the agent writes them).
func chownSpec(user string) string {
	u, g, hasGroup := strings.Cut(user, ":")
	switch {
	case hasGroup:
		return u + ":" + g
	case u == "" || u == "root" || u == "0":
		return ""
	}
	if _, err := strconv.ParseUint(u, 10, 32); err == nil {
		return u + ":" + u // a uid alone: the same gid (Docker's rule)
	}
	return u + ":" // the user's primary group
}

// ownerDefaults fills in the owner of each COPY that names none: the
// current USER (the image's, then USER steps) for a step from JSON, as
// E2B's server does, root for a Dockerfile's, as Docker does. It runs
// before the cache keys, so that a key names the owner the files get.
func ownerDefaults(steps []templatespec.Step, imageUser string) {
	user := imageUser
	for i := range steps {
		switch st := &steps[i]; st.Kind {
		case templatespec.StepUser:
			user = st.User
		case templatespec.StepCopy:
			if st.User != "" {
				continue
			}
			if st.Line > 0 || user == "" {
				st.User = "root"
			} else {
				st.User = user
			}
		}
	}
}
