package repo

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// ErrNeedsCheckout is a repository whose clone only a checkout makes
// right: its tree at main has submodules (.gitmodules) or attributes
// (.gitattributes, which change what git archive writes). Its clone is
// made by git inside the sandbox instead.
var ErrNeedsCheckout = errors.New("the repository needs a checkout (submodules or .gitattributes)")

// maxCloneEntries bounds the files of main's tree a clone archive carries;
// a larger tree is cloned in the sandbox.
const maxCloneEntries = 200_000

// RefsKey is a digest of the branches and tags of account's repository: a
// clone archive (WriteClone) of the repository is the same for as long as
// its RefsKey is.
func (m *Manager) RefsKey(ctx context.Context, accountID string) (string, error) {
	p, err := m.existing(ctx, accountID)
	if err != nil {
		return "", err
	}
	st := openStorage(p)
	defer st.Close()
	return refsKey(st, "refs/heads/")
}

// refsKey digests the branches (refs under heads) and tags of st.
func refsKey(st *filesystem.Storage, heads string) (string, error) {
	it, err := st.IterReferences()
	if err != nil {
		return "", fmt.Errorf("list references: %w", err)
	}
	var lines []string
	err = it.ForEach(func(r *plumbing.Reference) error {
		name := r.Name().String()
		switch {
		case r.Type() != plumbing.HashReference:
		case strings.HasPrefix(name, heads):
			lines = append(lines, "branch "+strings.TrimPrefix(name, heads)+" "+r.Hash().String())
		case strings.HasPrefix(name, "refs/tags/"):
			lines = append(lines, "tag "+strings.TrimPrefix(name, "refs/tags/")+" "+r.Hash().String())
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("list references: %w", err)
	}
	slices.Sort(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:]), nil
}

// WriteClone writes to w, as a tar archive, the clone of account's
// repository that `git clone` of remoteURL makes: .git with every branch
// as origin's and the tags, main checked out and tracking origin/main, and
// main's files beside it. It answers the RefsKey of what it wrote.
//
// The repository is written by the account's sandboxes, so it is hostile
// input, and nothing of it is checked out on the host (git's checkout is
// where crafted repositories attack: symbolic links, case folding,
// submodules). .git is made by a fetch into an empty repository (objects
// and references, which git checks) and an index read from main's tree;
// the files come from git archive of main, a stream this only passes
// through, its modes made what a checkout's are. A tree that needs a
// checkout is ErrNeedsCheckout.
func (m *Manager) WriteClone(ctx context.Context, accountID, remoteURL string, w io.Writer) (key string, err error) {
	if strings.ContainsAny(remoteURL, "\"\\\n\x00") {
		return "", fmt.Errorf("remote URL %q: quotes, backslashes and newlines are not written into a config", remoteURL)
	}
	bare, err := m.existing(ctx, accountID)
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp("", "sandboxd-clone-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	gitDir := filepath.Join(tmp, ".git")
	// Few entries make a fast unpack (each is a round trip to the file
	// system under gVisor): no template (its sample hooks), and the
	// fetched objects kept as one pack, never loose.
	if _, err := m.run(ctx, "", nil, "init", "-q", "--template=", "-b", MainBranch, tmp); err != nil {
		return "", err
	}
	// Nothing of the host may travel into the sandbox: no reflogs (their
	// messages name where the fetch came from), no FETCH_HEAD (which
	// names it too).
	if _, err := m.run(ctx, gitDir, nil, "-c", "fetch.unpackLimit=1", "-c", "core.logAllRefUpdates=false", "fetch", "-q", "--no-tags", bare, "+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"); err != nil {
		return "", err
	}
	if err := os.Remove(filepath.Join(gitDir, "FETCH_HEAD")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	// Main as fetched (a push may have moved it since this began), and
	// what its tree needs.
	st := openStorage(gitDir)
	head, err := checkoutFree(st, plumbing.NewRemoteReferenceName("origin", MainBranch))
	if err == nil {
		key, err = refsKey(st, "refs/remotes/origin/")
	}
	st.Close()
	if err != nil {
		return "", err
	}
	// What `git remote add origin` and `git branch --set-upstream-to`
	// write, appended to the config init made.
	cfg := fmt.Sprintf("[remote \"origin\"]\n\turl = %s\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n", remoteURL)
	if !head.IsZero() {
		cfg += "[branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n"
		if err := os.WriteFile(filepath.Join(gitDir, "refs", "heads", MainBranch), []byte(head.String()+"\n"), 0o644); err != nil {
			return "", err
		}
		if _, err := m.run(ctx, gitDir, nil, "read-tree", head.String()); err != nil {
			return "", err
		}
	}
	if err := appendFile(filepath.Join(gitDir, "config"), cfg); err != nil {
		return "", err
	}
	tw := tar.NewWriter(w)
	if err := tarDir(tw, gitDir, ".git"); err != nil {
		return "", err
	}
	if !head.IsZero() {
		if err := m.archiveInto(ctx, tw, gitDir, head); err != nil {
			return "", err
		}
	}
	return key, tw.Close()
}

// checkoutFree is the commit of ref in st (zero when there is none), or
// ErrNeedsCheckout when its tree needs a checkout.
func checkoutFree(st *filesystem.Storage, ref plumbing.ReferenceName) (plumbing.Hash, error) {
	r, err := st.Reference(ref)
	if errors.Is(err, plumbing.ErrReferenceNotFound) {
		return plumbing.ZeroHash, nil
	}
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("read %s: %w", ref, err)
	}
	head := r.Hash()
	c, err := object.GetCommit(st, head)
	if err != nil {
		return head, fmt.Errorf("read main's commit: %w", err)
	}
	tree, err := c.Tree()
	if err != nil {
		return head, fmt.Errorf("read main's tree: %w", err)
	}
	walker := object.NewTreeWalker(tree, true, nil)
	defer walker.Close()
	for n := 0; ; n++ {
		name, _, err := walker.Next()
		if errors.Is(err, io.EOF) {
			return head, nil
		}
		if err != nil {
			return head, fmt.Errorf("walk main's tree: %w", err)
		}
		if n >= maxCloneEntries {
			return head, fmt.Errorf("%w: more than %d entries", ErrNeedsCheckout, maxCloneEntries)
		}
		if base := path.Base(name); base == ".gitmodules" || base == ".gitattributes" {
			return head, ErrNeedsCheckout
		}
	}
}

// archiveInto appends main's files (git archive of head, from the
// repository gitDir) to tw: directories 0755, files 0644 or 0755 and symbolic
// links, as a checkout under umask 022 makes them; anything else in the
// stream ends it.
func (m *Manager) archiveInto(ctx context.Context, tw *tar.Writer, gitDir string, head plumbing.Hash) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.git, "--git-dir="+gitDir, "archive", "--format=tar", head.String())
	cmd.Env = gitEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("git archive: %w", err)
	}
	copyErr := copyArchive(tw, out)
	if copyErr != nil {
		cancel()
	}
	// Drain what is left so git is not stuck writing, then reap it.
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil && copyErr == nil {
		return &GitError{Args: []string{"archive", head.String()}, Stderr: strings.TrimSpace(stderr.String()), Err: err}
	}
	return copyErr
}

// copyArchive copies git archive's entries from r into tw.
func copyArchive(tw *tar.Writer, r io.Reader) error {
	tr := tar.NewReader(r)
	now := time.Now()
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read git archive: %w", err)
		}
		out := &tar.Header{Name: hdr.Name, ModTime: now, Format: tar.FormatPAX}
		switch hdr.Typeflag {
		case tar.TypeXGlobalHeader:
			continue // the commit's id, as a comment
		case tar.TypeDir:
			out.Typeflag, out.Mode = tar.TypeDir, 0o755
		case tar.TypeReg:
			out.Typeflag, out.Mode, out.Size = tar.TypeReg, 0o644, hdr.Size
			if hdr.Mode&0o111 != 0 {
				out.Mode = 0o755
			}
		case tar.TypeSymlink:
			out.Typeflag, out.Mode, out.Linkname = tar.TypeSymlink, 0o777, hdr.Linkname
		default:
			return fmt.Errorf("git archive: entry %q of type %q", hdr.Name, hdr.Typeflag)
		}
		if err := tw.WriteHeader(out); err != nil {
			return err
		}
		if out.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return err
			}
		}
	}
}

// tarDir writes the tree at dir (made here, by git) into tw under prefix.
func tarDir(tw *tar.Writer, dir, prefix string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = path.Join(prefix, filepath.ToSlash(rel))
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.Format = tar.FormatPAX
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
}

func appendFile(p, s string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
