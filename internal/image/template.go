package image

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// formatVersion changes whenever the builder changes what it does to every
// image (the finishing touches in finalize, the build environment), so that
// images built by an older sandboxd are not mistaken for current ones.
const formatVersion = 2

// DefaultTemplate is the template `serve` and `image build` use unless told
// otherwise.
const DefaultTemplate = "full"

// Pinned versions of what the full template installs from the npm registry.
// Bumping one changes the full template's key, so the next Ensure rebuilds.
const (
	nodeVersion       = "24.22.3"
	npmVersion        = "12.2.2"
	opencodeVersion   = "1.18.33"
	claudeCodeVersion = "2.1.332"
	openclawVersion   = "2026.9.6"
)

// Template describes how to build one base root filesystem. It is plain data:
// everything that decides the content of the image is in it, so its hash
// together with formatVersion (see key) names the cached result.
type Template struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Parent, when set, names the template whose finished root filesystem
	// this one starts from (copied, then Steps run). Suite, Variant and
	// Packages are then empty.
	Parent string `json:"parent,omitempty"`
	// Suite and Variant are given to debootstrap ("bookworm", "minbase").
	Suite   string `json:"suite,omitempty"`
	Variant string `json:"variant,omitempty"`
	// Packages are extra Debian packages debootstrap installs (--include).
	Packages []string `json:"packages,omitempty"`
	// Steps run inside the root filesystem, in order, after the packages.
	Steps []Step `json:"steps,omitempty"`
	// Highlights name the packages (Debian or npm) that `image ls` shows
	// with their versions. They do not change the content, so they are not
	// part of the key.
	Highlights []string `json:"highlights,omitempty"`
	// Commands are the agent CLIs the image adds, which requests that need
	// them (a prompt needs opencode) are checked against. Not part of the
	// key: the Steps decide them.
	Commands []string `json:"commands,omitempty"`
}

// Step is one command run inside the image's root filesystem while it is
// built (a chroot with /proc, /sys and /dev mounted and the host's network).
type Step struct {
	Name string   `json:"name"`
	Argv []string `json:"argv"`
	// Env is added to the build environment for this step only.
	Env []string `json:"env,omitempty"`
}

// Templates returns the built-in templates, smallest first. Each call returns
// fresh values, so callers may modify them.
func Templates() []Template {
	minimal := []string{"ca-certificates", "curl", "git"}
	base := append(slices.Clone(minimal),
		"jq", "less", "make", "nodejs", "npm", "openssh-client", "procps",
		// python-is-python3: `python` is python3, as E2B's base has it
		// (programs written for E2B call python).
		"python3", "python-is-python3", "ripgrep", "sudo", "unzip", "xz-utils", "zstd")
	slices.Sort(base)

	// Debian 12 ships Node.js 18, older than the agent CLIs accept
	// (openclaw needs 24, claude-code 22), so the full template installs
	// Node.js itself from the npm registry, where node-linux-<arch> packages
	// the official build, then a current npm with that Node.js.
	nodePkg := "node-linux-" + nodeArch(runtime.GOARCH)
	global := []string{"npm", "install", "--global", "--prefix", "/usr/local"}
	return []Template{
		{
			Name:        "minimal",
			Description: "Debian 12 minbase with git, curl and CA certificates; for tests and quick starts",
			Suite:       "bookworm",
			Variant:     "minbase",
			Packages:    minimal,
			Highlights:  []string{"git", "curl"},
		},
		{
			Name:        "base",
			Description: "minimal plus Python 3, Node.js, npm, sudo and the command-line tools a coding agent expects",
			Suite:       "bookworm",
			Variant:     "minbase",
			Packages:    base,
			Steps: []Step{
				// E2B's base lets its user run sudo without a password,
				// and programs written for E2B call it. It gives the
				// code in a sandbox nothing it lacks: an exec may run
				// as root already, and root in a sandbox is the
				// sandbox's own.
				{Name: "passwordless sudo for " + userName, Argv: []string{"sh", "-ec",
					"printf '%s ALL=(ALL:ALL) NOPASSWD: ALL\\n' " + userName + " > /etc/sudoers.d/" + userName +
						"; chmod 0440 /etc/sudoers.d/" + userName + "; visudo -cf /etc/sudoers.d/" + userName}},
			},
			Highlights: []string{"git", "python3", "nodejs", "npm", "ripgrep", "jq", "sudo"},
		},
		{
			Name:        "full",
			Description: "base plus Node.js " + nodeVersion + " and the agent CLIs opencode, claude and openclaw",
			Parent:      "base",
			Steps: []Step{
				{Name: "install Node.js " + nodeVersion, Argv: append(slices.Clone(global), nodePkg+"@"+nodeVersion)},
				// /usr/local/bin comes first on PATH, so from here on
				// "npm" runs with the Node.js just installed.
				{Name: "install npm " + npmVersion, Argv: append(slices.Clone(global), "npm@"+npmVersion)},
				// npm 12 runs no dependency's install scripts unless
				// allowed. These are the ones the pinned CLIs have, each
				// reviewed: opencode and claude link their platform's
				// binary, openclaw sets up its bundled plugins, koffi
				// installs its prebuilt library, protobufjs and genai
				// check versions. --strict-allow-scripts fails the build
				// when a new version brings a script not listed here,
				// instead of leaving a CLI half installed.
				{Name: "install agent CLIs", Argv: append(slices.Clone(global),
					"--strict-allow-scripts",
					"--allow-scripts=opencode-ai,@anthropic-ai/claude-code,openclaw,koffi,protobufjs,@google/genai",
					"opencode-ai@"+opencodeVersion,
					"@anthropic-ai/claude-code@"+claudeCodeVersion,
					"openclaw@"+openclawVersion)},
				// Fail the build, not the first sandbox, when a CLI cannot
				// start. HOME points into /tmp so that whatever they write
				// on first run is wiped with the build's scratch files.
				{
					Name: "check agent CLIs",
					Argv: []string{"sh", "-ec", "node --version; npm --version; opencode --version; claude --version; openclaw --version"},
					Env:  []string{"HOME=/tmp/check-home"},
				},
			},
			Highlights: []string{nodePkg, "npm", "opencode-ai", "@anthropic-ai/claude-code", "openclaw", "git", "python3"},
			Commands:   []string{"opencode", "claude", "openclaw"},
		},
		{
			Name:        CodeInterpreterTemplate,
			Description: "full plus the code interpreter's Jupyter kernels: Python 3 with ipykernel, numpy, pandas, matplotlib, scipy and Pillow, and R (Debian's), and `python`",
			Parent:      "full",
			Steps: []Step{
				{
					Name: "install Jupyter and the data stack",
					Argv: []string{"sh", "-ec", "apt-get update; apt-get install -y --no-install-recommends " +
						strings.Join(codeInterpreterPackages, " ") + "; apt-get clean"},
					Env: []string{"DEBIAN_FRONTEND=noninteractive"},
				},
				// Fail the build, not the first execution, when the
				// kernel or the data stack cannot load.
				{
					Name: "check the Python kernel",
					Argv: []string{"python3", "-c", "import jupyter_client, ipykernel, numpy, pandas, matplotlib, scipy, PIL; " +
						"from jupyter_client.kernelspec import KernelSpecManager; KernelSpecManager().get_kernel_spec('python3')"},
					Env: []string{"HOME=/tmp/check-home", "MPLCONFIGDIR=/tmp/check-home"},
				},
			},
			Highlights: []string{"python3-ipykernel", "python3-jupyter-client", "python3-numpy", "python3-pandas", "python3-matplotlib"},
			Commands:   []string{"opencode", "claude", "openclaw", "python"},
		},
	}
}

// CodeInterpreterTemplate is the built-in template with Jupyter's kernels,
// which E2B's code-interpreter SDK's template (code-interpreter-v1) names.
const CodeInterpreterTemplate = "code-interpreter"

// codeInterpreterPackages are the Debian packages the code-interpreter
// template adds: a Python kernel, the client the guest agent's shim drives
// it with, and the data stack E2B's template has (in Debian 12's versions).
var codeInterpreterPackages = []string{
	"python3-ipykernel", "python3-jupyter-client", "python3-numpy", "python3-pandas",
	"python3-matplotlib", "python3-scipy", "python3-pil", "python3-requests", "python-is-python3", "fonts-dejavu-core",
	// R, as E2B's template has it: IRkernel is packaged.
	"r-cran-irkernel",
}

// HasCodeInterpreter reports whether the root filesystem at rootfs has a
// Python Jupyter kernel the code interpreter can start.
func HasCodeInterpreter(rootfs string) bool {
	for _, dir := range []string{"usr/share/jupyter/kernels/python3", "usr/local/share/jupyter/kernels/python3"} {
		if fi, err := os.Stat(filepath.Join(rootfs, dir, "kernel.json")); err == nil && fi.Mode().IsRegular() {
			return true
		}
	}
	return false
}

// LookupTemplate returns the built-in template with the given name.
func LookupTemplate(name string) (Template, bool) {
	for _, t := range Templates() {
		if t.Name == name {
			return t, true
		}
	}
	return Template{}, false
}

// nodeArch maps a Go architecture to the one Node.js release names use.
func nodeArch(goarch string) string {
	switch goarch {
	case "amd64":
		return "x64"
	case "386":
		return "x86"
	default:
		return goarch
	}
}

// key hashes everything that decides the content of the template's image:
// the definition (without cosmetic fields), the builder's format version,
// the architecture and, for derived templates, the parent image's key.
func (t Template) key(parentKey string) string {
	pkgs := slices.Clone(t.Packages)
	slices.Sort(pkgs)
	in := struct {
		Format   int      `json:"format"`
		Arch     string   `json:"arch"`
		Parent   string   `json:"parent,omitempty"`
		Suite    string   `json:"suite,omitempty"`
		Variant  string   `json:"variant,omitempty"`
		Packages []string `json:"packages,omitempty"`
		Steps    []Step   `json:"steps,omitempty"`
	}{formatVersion, runtime.GOARCH, parentKey, t.Suite, t.Variant, pkgs, t.Steps}
	b, err := json.Marshal(in)
	if err != nil {
		// Strings and slices of strings always marshal.
		panic(fmt.Sprintf("marshal template key: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// validate checks the definition is buildable before any work starts.
func (t Template) validate() error {
	switch {
	case t.Name == "":
		return fmt.Errorf("template has no name")
	case t.Parent == "" && (t.Suite == "" || t.Variant == ""):
		return fmt.Errorf("template %s: needs a suite and a variant, or a parent", t.Name)
	case t.Parent != "" && (t.Suite != "" || t.Variant != "" || len(t.Packages) > 0):
		return fmt.Errorf("template %s: a template with a parent cannot set suite, variant or packages", t.Name)
	}
	for i, s := range t.Steps {
		if len(s.Argv) == 0 {
			return fmt.Errorf("template %s: step %d (%q) has no command", t.Name, i, s.Name)
		}
	}
	return nil
}

// shortKey is the part of a key that goes into an image ID.
func shortKey(key string) string {
	if len(key) > 12 {
		return key[:12]
	}
	return key
}

func imageID(template, key string) string {
	return template + "-" + shortKey(key)
}
