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

// Mirrors are the Debian archives an image's packages come from.
type Mirrors struct {
	// Main serves the suite and its -updates suite.
	Main string
	// Security serves the -security suite; empty when unknown, and then
	// images get no security updates beyond the suite's point release.
	Security string
}

// HostMirrors returns the Debian mirrors the host's APT is configured with,
// so images are built from archives the host already trusts and reaches (and
// no mirror host name lives in sandboxd's code). For the main archive it
// prefers an entry that lists suite itself, then any entry that is not a
// security, updates or backports archive; for security, the entry that lists
// suite-security, then any security archive.
func HostMirrors(suite string) (Mirrors, error) {
	return hostMirrors("/", suite)
}

// hostMirrors is HostMirrors reading the APT configuration below root.
func hostMirrors(root, suite string) (Mirrors, error) {
	sources, err := hostSources(root)
	if err != nil {
		return Mirrors{}, err
	}
	main, ok := pickMirror(sources, suite)
	if !ok {
		return Mirrors{}, fmt.Errorf("no Debian mirror for %s in %s: pass a mirror explicitly", suite, filepath.Join(root, "etc/apt"))
	}
	security, _ := pickSecurityMirror(sources, suite)
	return Mirrors{Main: main, Security: security}, nil
}

// hostSources reads the "deb" entries of the APT configuration below root.
func hostSources(root string) ([]aptSource, error) {
	var sources []aptSource
	list := filepath.Join(root, "etc/apt/sources.list")
	if data, err := os.ReadFile(list); err == nil {
		sources = append(sources, parseSourcesList(data)...)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", list, err)
	}
	dir := filepath.Join(root, "etc/apt/sources.list.d")
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", dir, err)
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
			return nil, fmt.Errorf("read apt source %s: %w", name, err)
		}
		if strings.HasSuffix(name, ".sources") {
			sources = append(sources, parseDeb822Sources(data)...)
		} else {
			sources = append(sources, parseSourcesList(data)...)
		}
	}
	return sources, nil
}

// pickSecurityMirror chooses the archive that serves suite-security.
func pickSecurityMirror(sources []aptSource, suite string) (string, bool) {
	for _, s := range sources {
		if usableURI(s.URI) && slices.Contains(s.Suites, suite+"-security") {
			return s.URI, true
		}
	}
	// A host on another release: its security archive serves every
	// supported suite.
	for _, s := range sources {
		if usableURI(s.URI) && slices.ContainsFunc(s.Suites, func(x string) bool { return strings.HasSuffix(x, "-security") }) {
			return s.URI, true
		}
	}
	return "", false
}

// aptSourcesFile is the deb822 sources file an image gets, in the place and
// format Debian 12 uses: the main archive with its updates, and security.
func aptSourcesFile(suite string, m Mirrors) string {
	const keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
	var b strings.Builder
	fmt.Fprintf(&b, "Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: %s\n", m.Main, suite, suite, keyring)
	if m.Security != "" {
		fmt.Fprintf(&b, "\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\nSigned-By: %s\n", m.Security, suite, keyring)
	}
	return b.String()
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
