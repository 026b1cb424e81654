package image

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseSourcesList(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []aptSource
	}{
		{"plain", "deb http://mirror.example/debian bookworm main\n",
			[]aptSource{{URI: "http://mirror.example/debian", Suites: []string{"bookworm"}}}},
		{"comments, deb-src and blank lines skipped",
			"# deb http://old.example/debian buster main\n\ndeb-src http://src.example/debian bookworm main\ndeb http://mirror.example/debian bookworm main contrib # trailing\n",
			[]aptSource{{URI: "http://mirror.example/debian", Suites: []string{"bookworm"}}}},
		{"options in one field", "deb [signed-by=/usr/share/keyrings/k.gpg] https://mirror.example/debian bookworm-updates main\n",
			[]aptSource{{URI: "https://mirror.example/debian", Suites: []string{"bookworm-updates"}}}},
		{"options over several fields", "deb [ arch=amd64 signed-by=/k.gpg ] http://mirror.example/debian bookworm main\n",
			[]aptSource{{URI: "http://mirror.example/debian", Suites: []string{"bookworm"}}}},
		{"unterminated options", "deb [arch=amd64 http://mirror.example/debian bookworm main\n", nil},
		{"too short", "deb http://mirror.example/debian\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseSourcesList([]byte(tt.in)); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// debianSources is the layout of Debian 12's default
// /etc/apt/sources.list.d/debian.sources, with example host names.
const debianSources = `Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.example/archive/debian-security/20250520T000000Z
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
`

func TestParseDeb822Sources(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []aptSource
	}{
		{"debian 12 default", debianSources, []aptSource{
			{URI: "http://mirror.example/debian", Suites: []string{"bookworm", "bookworm-updates"}},
			{URI: "http://mirror.example/debian-security", Suites: []string{"bookworm-security"}},
		}},
		{"disabled stanza", "Enabled: no\nTypes: deb\nURIs: http://a.example/debian\nSuites: bookworm\n", nil},
		{"deb-src only", "Types: deb-src\nURIs: http://a.example/debian\nSuites: bookworm\n", nil},
		{"both types, several URIs, folded field", "types: deb deb-src\nURIs: http://a.example/debian\n http://b.example/debian\nSuites: bookworm\n",
			[]aptSource{
				{URI: "http://a.example/debian", Suites: []string{"bookworm"}},
				{URI: "http://b.example/debian", Suites: []string{"bookworm"}},
			}},
		{"blank lines between stanzas", "\n\nTypes: deb\nURIs: http://a.example/debian\nSuites: trixie\n\n\n",
			[]aptSource{{URI: "http://a.example/debian", Suites: []string{"trixie"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseDeb822Sources([]byte(tt.in)); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestPickMirror(t *testing.T) {
	tests := []struct {
		name    string
		sources []aptSource
		suite   string
		want    string
		ok      bool
	}{
		{"exact suite wins over order", []aptSource{
			{URI: "http://security.example/debian-security", Suites: []string{"bookworm-security"}},
			{URI: "http://other.example/debian", Suites: []string{"trixie"}},
			{URI: "http://mirror.example/debian", Suites: []string{"bookworm"}},
		}, "bookworm", "http://mirror.example/debian", true},
		{"another release's main archive", []aptSource{
			{URI: "http://security.example/debian-security", Suites: []string{"trixie-security"}},
			{URI: "http://mirror.example/debian", Suites: []string{"trixie", "trixie-updates"}},
		}, "bookworm", "http://mirror.example/debian", true},
		{"only security and backports", []aptSource{
			{URI: "http://mirror.example/debian-security", Suites: []string{"bookworm"}},
			{URI: "http://mirror.example/debian", Suites: []string{"bookworm-backports"}},
		}, "trixie", "", false},
		{"unusable scheme skipped", []aptSource{
			{URI: "cdrom:[Debian 12]/", Suites: []string{"bookworm"}},
			{URI: "mirror+file:/etc/apt/mirrors.txt", Suites: []string{"bookworm"}},
			{URI: "file:/srv/debian", Suites: []string{"bookworm"}},
		}, "bookworm", "file:/srv/debian", true},
		{"nothing", nil, "bookworm", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := pickMirror(tt.sources, tt.suite)
			if got != tt.want || ok != tt.ok {
				t.Errorf("pickMirror = %q, %v; want %q, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestPickSecurityMirror(t *testing.T) {
	tests := []struct {
		name    string
		sources []aptSource
		want    string
	}{
		{"exact suite", []aptSource{
			{URI: "http://mirror.example/debian", Suites: []string{"bookworm"}},
			{URI: "http://other.example/debian-security", Suites: []string{"trixie-security"}},
			{URI: "http://mirror.example/debian-security", Suites: []string{"bookworm-security"}},
		}, "http://mirror.example/debian-security"},
		{"another release's security archive", []aptSource{
			{URI: "http://mirror.example/debian", Suites: []string{"trixie"}},
			{URI: "http://security.example/debian-security", Suites: []string{"trixie-security"}},
		}, "http://security.example/debian-security"},
		{"none", []aptSource{{URI: "http://mirror.example/debian", Suites: []string{"bookworm", "bookworm-updates"}}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := pickSecurityMirror(tt.sources, "bookworm")
			if got != tt.want || ok != (tt.want != "") {
				t.Errorf("pickSecurityMirror = %q, %v; want %q", got, ok, tt.want)
			}
		})
	}
}

func TestAptSourcesFile(t *testing.T) {
	got := aptSourcesFile("bookworm", Mirrors{Main: "http://mirror.example/debian", Security: "http://mirror.example/debian-security"})
	// What we write, APT (and our own parser) must read back.
	parsed := parseDeb822Sources([]byte(got))
	want := []aptSource{
		{URI: "http://mirror.example/debian", Suites: []string{"bookworm", "bookworm-updates"}},
		{URI: "http://mirror.example/debian-security", Suites: []string{"bookworm-security"}},
	}
	if !reflect.DeepEqual(parsed, want) {
		t.Errorf("parsed back %+v, want %+v from:\n%s", parsed, want, got)
	}
	if !strings.Contains(got, "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg") {
		t.Errorf("sources lack Signed-By:\n%s", got)
	}
	noSec := parseDeb822Sources([]byte(aptSourcesFile("bookworm", Mirrors{Main: "http://mirror.example/debian"})))
	if len(noSec) != 1 {
		t.Errorf("without a security mirror: %+v", noSec)
	}
}

func TestHostMirrors(t *testing.T) {
	write := func(t *testing.T, root string, files map[string]string) {
		t.Helper()
		for name, content := range files {
			p := filepath.Join(root, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name    string
		files   map[string]string
		want    Mirrors
		wantErr bool
	}{
		{"debian 12 deb822", map[string]string{"etc/apt/sources.list.d/debian.sources": debianSources},
			Mirrors{Main: "http://mirror.example/debian", Security: "http://mirror.example/debian-security"}, false},
		{"one-line sources.list", map[string]string{"etc/apt/sources.list": "deb http://mirror.example/debian bookworm main\ndeb http://security.example/debian-security bookworm-security main\n"},
			Mirrors{Main: "http://mirror.example/debian", Security: "http://security.example/debian-security"}, false},
		{"disabled files ignored", map[string]string{
			"etc/apt/sources.list.d/nodesource.sources.disabled": "Types: deb\nURIs: https://node.example/x\nSuites: bookworm\n",
			"etc/apt/sources.list.d/old.list.save":               "deb http://old.example/debian bookworm main\n",
			"etc/apt/sources.list.d/debian.sources":              debianSources,
		}, Mirrors{Main: "http://mirror.example/debian", Security: "http://mirror.example/debian-security"}, false},
		{"third-party list with the suite name, no security", map[string]string{
			"etc/apt/sources.list":                 "deb http://mirror.example/debian bookworm main\n",
			"etc/apt/sources.list.d/a-vendor.list": "deb https://vendor.example/apt cloud-sdk-bookworm main\n",
		}, Mirrors{Main: "http://mirror.example/debian"}, false},
		{"no configuration", map[string]string{}, Mirrors{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, tt.files)
			got, err := hostMirrors(root, "bookworm")
			if (err != nil) != tt.wantErr {
				t.Fatalf("hostMirrors err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("hostMirrors = %+v, want %+v", got, tt.want)
			}
		})
	}
}
