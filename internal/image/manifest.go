package image

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// manifestName is the file beside rootfs/ that describes a finished image.
// Its presence is what makes an image directory valid: it is written last,
// inside the temporary directory, before the rename that publishes both.
const manifestName = "manifest.json"

// Package is a piece of software installed in an image.
type Package struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// Source is where it came from: "deb" (dpkg) or "npm" (a global
	// package under /usr/local/lib/node_modules).
	Source string `json:"source"`
}

// manifest is the on-disk form of an Image.
type manifest struct {
	ID             string    `json:"id"`
	Template       string    `json:"template"`
	Key            string    `json:"key"`
	Format         int       `json:"format"`
	Parent         string    `json:"parent,omitempty"`
	Mirror         string    `json:"mirror,omitempty"`
	SecurityMirror string    `json:"security_mirror,omitempty"`
	CreatedAt      time.Time `json:"created"`
	Size           int64     `json:"size"`
	BuildDuration  float64   `json:"build_seconds"`
	Highlights     []Package `json:"highlights"`
	Packages       []Package `json:"packages"`
}

func writeManifest(dir string, m manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	p := filepath.Join(dir, manifestName)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("write manifest %s: %w", p, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write manifest %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write manifest %s: %w", p, err)
	}
	return nil
}

func readManifest(dir string) (manifest, error) {
	var m manifest
	b, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("decode %s: %w", filepath.Join(dir, manifestName), err)
	}
	return m, nil
}

// installedPackages lists the Debian packages dpkg records as installed in
// rootfs and the npm packages installed globally under /usr/local.
func installedPackages(rootfs string) ([]Package, error) {
	var pkgs []Package
	status, err := os.ReadFile(filepath.Join(rootfs, "var/lib/dpkg/status"))
	switch {
	case err == nil:
		pkgs = parseDpkgStatus(status)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("read dpkg status: %w", err)
	}
	npm, err := npmGlobals(os.DirFS(filepath.Join(rootfs, "usr/local/lib/node_modules")))
	if err != nil {
		return nil, fmt.Errorf("list npm packages: %w", err)
	}
	return append(pkgs, npm...), nil
}

// parseDpkgStatus reads dpkg's status database: stanzas of "Field: value"
// lines separated by blank lines. Only packages whose status ends in
// "installed" count (removed packages leave "deinstall ok config-files").
func parseDpkgStatus(data []byte) []Package {
	var out []Package
	var name, version, status string
	flush := func() {
		if name != "" && strings.HasSuffix(status, " installed") {
			out = append(out, Package{Name: name, Version: version, Source: "deb"})
		}
		name, version, status = "", "", ""
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			flush()
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Package":
			name = v
		case "Version":
			version = v
		case "Status":
			status = v
		}
	}
	flush()
	slices.SortFunc(out, func(a, b Package) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// npmGlobals lists the packages in a global node_modules directory
// (name/package.json and @scope/name/package.json). Dot-directories are
// npm's staging leftovers, not packages.
func npmGlobals(fsys fs.FS) ([]Package, error) {
	var out []Package
	read := func(dir string) error {
		b, err := fs.ReadFile(fsys, path.Join(dir, "package.json"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		var pj struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		}
		if err := json.Unmarshal(b, &pj); err != nil {
			return fmt.Errorf("%s/package.json: %w", dir, err)
		}
		if pj.Name == "" {
			pj.Name = dir
		}
		out = append(out, Package{Name: pj.Name, Version: pj.Version, Source: "npm"})
		return nil
	}
	entries, err := fs.ReadDir(fsys, ".")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || strings.HasPrefix(name, ".") {
			continue
		}
		if !strings.HasPrefix(name, "@") {
			if err := read(name); err != nil {
				return nil, err
			}
			continue
		}
		scoped, err := fs.ReadDir(fsys, name)
		if err != nil {
			return nil, err
		}
		for _, s := range scoped {
			if s.IsDir() && !strings.HasPrefix(s.Name(), ".") {
				if err := read(path.Join(name, s.Name())); err != nil {
					return nil, err
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Package) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// highlights picks the named packages out of pkgs, in the order of names,
// preferring npm's over Debian's when both exist (the full template's npm
// shadows Debian's on PATH).
func highlights(pkgs []Package, names []string) []Package {
	var out []Package
	for _, n := range names {
		var found *Package
		for i := range pkgs {
			if pkgs[i].Name == n && (found == nil || pkgs[i].Source == "npm") {
				found = &pkgs[i]
			}
		}
		if found != nil {
			out = append(out, *found)
		}
	}
	return out
}
