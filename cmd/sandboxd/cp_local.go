package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// The local side of `sandbox cp`: this machine's files as a tar archive,
// and an archive from a sandbox unpacked here. The archive comes from a
// sandbox, whose code may be anyone's: nothing it names is written
// outside the directory it is unpacked into (os.Root), links included.

// writeLocalTar writes the tar archive of src (a file, or a directory and
// everything below it) to w, its top entry named name. Links are archived
// as links, never followed; sockets, pipes and devices are left out, said
// on warn.
func writeLocalTar(w io.Writer, src, name string, warn io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		return addLocal(tw, p, path.Join(name, filepath.ToSlash(rel)), warn)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// addLocal adds the file at p to tw as name.
func addLocal(tw *tar.Writer, p, name string, warn io.Writer) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	var link string
	switch m := fi.Mode(); {
	case m&fs.ModeSymlink != 0:
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	case !m.IsRegular() && !m.IsDir():
		fmt.Fprintf(warn, "sandboxd: not copied: %s is not a file or directory\n", p)
		return nil
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return fmt.Errorf("archive %s: %w", p, err)
	}
	// Whose the files are here means nothing in the sandbox.
	hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = name, 0, 0, "", ""
	if fi.IsDir() {
		hdr.Name += "/"
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("archive %s: %w", p, err)
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.CopyN(tw, f, fi.Size()); err != nil {
		return fmt.Errorf("archive %s: %w", p, err)
	}
	return nil
}

// unpacked says what extractLocalTar wrote.
type unpacked struct {
	Files       int   `json:"files"`
	Directories int   `json:"directories"`
	Bytes       int64 `json:"bytes"`
}

// extractLocalTar unpacks the archive r into the directory into, its top
// entry renamed to rename unless that is "". Files keep their permission
// bits and modification times; links are made as links, and nothing is
// written through one that leads outside into.
func extractLocalTar(r io.Reader, into, rename string) (unpacked, error) {
	var out unpacked
	root, err := os.OpenRoot(into)
	if err != nil {
		return out, err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("read the archive: %w", err)
		}
		name, err := localName(hdr.Name, rename)
		if err != nil || name == "" {
			return out, err
		}
		if err := unpackEntry(root, name, hdr, tr, &out); err != nil {
			return out, err
		}
	}
}

// localName is an archive entry's name below the directory it is
// unpacked into, its first element replaced by rename when that is set;
// "" for the archive's root. A name that would leave the directory is an
// error.
func localName(name, rename string) (string, error) {
	if strings.HasPrefix(name, "/") || slices.Contains(strings.Split(name, "/"), "..") {
		return "", fmt.Errorf("the archive's entry %q would be written outside the destination", name)
	}
	clean := path.Clean(name)
	if clean == "." {
		return "", nil
	}
	if rename != "" {
		_, rest, nested := strings.Cut(clean, "/")
		clean = rename
		if nested {
			clean += "/" + rest
		}
	}
	return filepath.FromSlash(clean), nil
}

// unpackEntry writes one entry of the archive as name in root.
func unpackEntry(root *os.Root, name string, hdr *tar.Header, r io.Reader, out *unpacked) error {
	perm := fs.FileMode(hdr.Mode).Perm()
	if dir := filepath.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.MkdirAll(name, 0o755); err != nil {
			return err
		}
		out.Directories++
		_ = root.Chmod(name, perm|0o700) // the files below must stay writable to this copy
	case tar.TypeReg:
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
		if err != nil {
			return err
		}
		n, err := io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		out.Files++
		out.Bytes += n
		_ = root.Chmod(name, perm)
	case tar.TypeSymlink:
		if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return root.Symlink(hdr.Linkname, name)
	default:
		return nil // nothing else travels out of a sandbox
	}
	return root.Chtimes(name, hdr.ModTime, hdr.ModTime)
}
