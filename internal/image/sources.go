package image

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// aptSource is one "deb" entry of the host's APT configuration.
type aptSource struct {
	URI    string
	Suites []string
}

// HostMirror returns the Debian mirror the host's APT is configured with, so
// images are built from the same mirror the host already trusts and reaches
// (and no mirror host name lives in sandboxd's code). It prefers an entry that
// lists suite itself, then any entry that is not a security, updates or
// backports archive.
func HostMirror(suite string) (string, error) {
	return hostMirror("/", suite)
}

// hostMirror is HostMirror reading the APT configuration below root.
func hostMirror(root, suite string) (string, error) {
	var sources []aptSource
	list := filepath.Join(root, "etc/apt/sources.list")
	if data, err := os.ReadFile(list); err == nil {
		sources = append(sources, parseSourcesList(data)...)
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read %s: %w", list, err)
	}
	dir := filepath.Join(root, "etc/apt/sources.list.d")
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read %s: %w", dir, err)
	}
	// APT reads only these two suffixes; files renamed to disable them
	// (".disabled", ".save") must not count.
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !(strings.HasSuffix(name, ".list") || strings.HasSuffix(name, ".sources")) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("read apt source %s: %w", name, err)
		}
		if strings.HasSuffix(name, ".sources") {
			sources = append(sources, parseDeb822Sources(data)...)
		} else {
			sources = append(sources, parseSourcesList(data)...)
		}
	}
	if m, ok := pickMirror(sources, suite); ok {
		return m, nil
	}
	return "", fmt.Errorf("no Debian mirror for %s in %s: pass a mirror explicitly", suite, filepath.Join(root, "etc/apt"))
}

// pickMirror chooses the mirror debootstrap should use for suite.
func pickMirror(sources []aptSource, suite string) (string, bool) {
	for _, s := range sources {
		if usableURI(s.URI) && slices.Contains(s.Suites, suite) {
			return s.URI, true
		}
	}
	for _, s := range sources {
		if !usableURI(s.URI) {
			continue
		}
		main := slices.ContainsFunc(s.Suites, func(x string) bool {
			return !strings.ContainsAny(x, "-/") // bookworm-security, bookworm/updates, bookworm-backports
		})
		if main && !strings.HasSuffix(strings.TrimRight(s.URI, "/"), "-security") {
			return s.URI, true
		}
	}
	return "", false
}

// usableURI reports whether debootstrap can fetch from uri.
func usableURI(uri string) bool {
	for _, p := range []string{"http://", "https://", "file:/"} {
		if strings.HasPrefix(uri, p) {
			return true
		}
	}
	return false
}

// parseSourcesList parses the one-line format:
//
//	deb [ option=value ... ] uri suite [component ...]
func parseSourcesList(data []byte) []aptSource {
	var out []aptSource
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			// Options may be written "[arch=amd64 signed-by=...]" over
			// several fields; skip to the one that closes them.
			end := slices.IndexFunc(f, func(s string) bool { return strings.HasSuffix(s, "]") })
			if end < 0 {
				continue
			}
			f = f[end+1:]
		}
		if len(f) < 2 {
			continue
		}
		out = append(out, aptSource{URI: f[0], Suites: []string{f[1]}})
	}
	return out
}

// parseDeb822Sources parses the deb822 format of *.sources files: stanzas of
// "Field: value" lines separated by blank lines, continuation lines starting
// with white space, "#" comments.
func parseDeb822Sources(data []byte) []aptSource {
	var out []aptSource
	flush := func(fields map[string]string) {
		if len(fields) == 0 {
			return
		}
		if strings.EqualFold(fields["enabled"], "no") {
			return
		}
		if !slices.Contains(strings.Fields(fields["types"]), "deb") {
			return
		}
		suites := strings.Fields(fields["suites"])
		for _, uri := range strings.Fields(fields["uris"]) {
			out = append(out, aptSource{URI: uri, Suites: suites})
		}
	}
	fields := map[string]string{}
	last := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			flush(fields)
			fields, last = map[string]string{}, ""
		case strings.HasPrefix(line, "#"):
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				fields[last] += " " + strings.TrimSpace(line)
			}
		default:
			name, value, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(name))
			fields[last] = strings.TrimSpace(value)
		}
	}
	flush(fields)
	return out
}
