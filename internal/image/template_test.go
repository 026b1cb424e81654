package image

import (
	"strings"
	"testing"
)

func TestTemplateKey(t *testing.T) {
	base := Template{
		Name:        "t",
		Description: "a template",
		Suite:       "bookworm",
		Variant:     "minbase",
		Packages:    []string{"curl", "git"},
		Steps:       []Step{{Name: "s", Argv: []string{"true"}}},
		Highlights:  []string{"git"},
	}
	baseKey := base.key("")
	tests := []struct {
		name   string
		modify func(*Template)
		parent string
		same   bool
	}{
		{"identical", func(*Template) {}, "", true},
		{"description is cosmetic", func(t *Template) { t.Description = "other words" }, "", true},
		{"highlights are cosmetic", func(t *Template) { t.Highlights = []string{"curl"} }, "", true},
		{"name is not content", func(t *Template) { t.Name = "renamed" }, "", true},
		{"package order does not matter", func(t *Template) { t.Packages = []string{"git", "curl"} }, "", true},
		{"suite", func(t *Template) { t.Suite = "trixie" }, "", false},
		{"variant", func(t *Template) { t.Variant = "buildd" }, "", false},
		{"package added", func(t *Template) { t.Packages = append(t.Packages, "jq") }, "", false},
		{"package removed", func(t *Template) { t.Packages = t.Packages[:1] }, "", false},
		{"step command", func(t *Template) { t.Steps[0].Argv = []string{"false"} }, "", false},
		{"step env", func(t *Template) { t.Steps[0].Env = []string{"A=1"} }, "", false},
		{"step added", func(t *Template) { t.Steps = append(t.Steps, Step{Name: "x", Argv: []string{"x"}}) }, "", false},
		{"parent key", func(*Template) {}, "0123abcd", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			c.Packages = append([]string(nil), base.Packages...)
			c.Steps = append([]Step(nil), base.Steps...)
			tt.modify(&c)
			got := c.key(tt.parent)
			if len(got) != 64 {
				t.Fatalf("key %q is not a hex SHA-256", got)
			}
			if (got == baseKey) != tt.same {
				t.Errorf("key equal to base = %v, want %v", got == baseKey, tt.same)
			}
		})
	}
}

func TestBuiltinTemplates(t *testing.T) {
	ts := Templates()
	names := map[string]Template{}
	for _, tmpl := range ts {
		if err := tmpl.validate(); err != nil {
			t.Errorf("template %s: %v", tmpl.Name, err)
		}
		if _, dup := names[tmpl.Name]; dup {
			t.Errorf("template %s defined twice", tmpl.Name)
		}
		names[tmpl.Name] = tmpl
	}
	for _, want := range []string{"minimal", "base", "full", DefaultTemplate} {
		if _, ok := names[want]; !ok {
			t.Errorf("template %s missing", want)
		}
	}
	// base must hold everything minimal has, and what the brief asks of a
	// coding agent's image.
	for _, p := range append(names["minimal"].Packages, "python3", "nodejs", "npm", "ripgrep", "jq", "openssh-client") {
		found := false
		for _, q := range names["base"].Packages {
			found = found || p == q
		}
		if !found {
			t.Errorf("base lacks %s", p)
		}
	}
	if names["full"].Parent != "base" {
		t.Errorf("full's parent = %q, want base", names["full"].Parent)
	}
	// Every npm install in full is pinned to an exact version.
	for _, s := range names["full"].Steps {
		if len(s.Argv) < 2 || s.Argv[0] != "npm" || s.Argv[1] != "install" {
			continue
		}
		for _, a := range s.Argv[2:] {
			if strings.HasPrefix(a, "-") || a == "/usr/local" {
				continue
			}
			at := strings.LastIndexByte(a, '@')
			if at <= 0 || strings.ContainsAny(a[at+1:], "^~*x<>") || a[at+1:] == "latest" {
				t.Errorf("npm package %q is not pinned to a version", a)
			}
		}
	}
	// Templates returns fresh values each call.
	ts[0].Packages[0] = "changed"
	if Templates()[0].Packages[0] == "changed" {
		t.Error("Templates shares its slices between calls")
	}
}

func TestTemplateValidate(t *testing.T) {
	tests := []struct {
		name    string
		t       Template
		wantErr string
	}{
		{"ok debootstrap", Template{Name: "a", Suite: "bookworm", Variant: "minbase"}, ""},
		{"ok parent", Template{Name: "a", Parent: "b", Steps: []Step{{Name: "s", Argv: []string{"true"}}}}, ""},
		{"no name", Template{Suite: "bookworm", Variant: "minbase"}, "no name"},
		{"no suite", Template{Name: "a", Variant: "minbase"}, "suite"},
		{"parent and suite", Template{Name: "a", Parent: "b", Suite: "bookworm"}, "parent"},
		{"parent and packages", Template{Name: "a", Parent: "b", Packages: []string{"x"}}, "parent"},
		{"empty step", Template{Name: "a", Parent: "b", Steps: []Step{{Name: "s"}}}, "no command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.t.validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("validate = %v, want an error about %q", err, tt.wantErr)
			}
		})
	}
}

func TestImageID(t *testing.T) {
	key := Template{Name: "minimal", Suite: "bookworm", Variant: "minbase"}.key("")
	id := imageID("minimal", key)
	if !strings.HasPrefix(id, "minimal-") || len(id) != len("minimal-")+12 || !strings.HasPrefix(key, strings.TrimPrefix(id, "minimal-")) {
		t.Errorf("imageID = %q for key %q", id, key)
	}
}

func TestNodeArch(t *testing.T) {
	for goarch, want := range map[string]string{"amd64": "x64", "arm64": "arm64", "386": "x86", "ppc64le": "ppc64le"} {
		if got := nodeArch(goarch); got != want {
			t.Errorf("nodeArch(%s) = %s, want %s", goarch, got, want)
		}
	}
}
