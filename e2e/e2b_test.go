package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestE2BSDK runs the official e2b JavaScript SDK against a real sandboxd:
// the node test files in e2e/e2b, once with each pinned SDK version (e2b
// 2.51.0, which creates and connects through /v2/sandboxes, and 2.50.0, the
// last release before it), pointed at the server's one listener with an
// e2b-format key. The node output streams into the test log.
//
// Both SDK versions run on gVisor, the newest on a microVM too (skipped
// where microVMs cannot run, or failing under SANDBOXD_REQUIRE_MICROVM=1).
//
// The server serves the base image: the SDK runs every command as
// `/bin/bash -l -c` and expects the user "user" with home /home/user, which
// the busybox test root filesystem does not have. `make test` has it cached
// (it builds full, whose parent is base); otherwise it is built here first.
//
// SANDBOXD_E2B_TESTS=REGEXP runs only the node tests whose names match (node's
// --test-name-pattern); SANDBOXD_E2B_SDK=new or old runs one SDK version.
// Without a Node.js >= 20.18.1 (scripts/install-node.sh) the test skips, or
// fails under SANDBOXD_REQUIRE_RUNTIME=1.
func TestE2BSDK(t *testing.T) {
	node := findNode(t)
	dir, err := filepath.Abs("e2b")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, node, dir)
	buildImage(t, "base")

	sdks := []string{"new", "old", "oldest"}
	if only := os.Getenv("SANDBOXD_E2B_SDK"); only != "" {
		sdks = []string{only}
	}
	// Every version on gVisor; the newest on a microVM too, which runs the
	// same agent behind another backend (its pause, fork and files).
	t.Run("gvisor", func(t *testing.T) { runE2BSDK(t, node, dir, nil, sdks) })
	t.Run("microvm", func(t *testing.T) {
		if !microVMReady(t) {
			return
		}
		runE2BSDK(t, node, dir, []string{"--runtime", "microvm"}, sdks[:1])
	})
}

// runE2BSDK starts a server on the base image with flags and runs the
// node tests once per SDK version against it.
func runE2BSDK(t *testing.T, node nodeInstall, dir string, flags, sdks []string) {
	// A domain, so that getHost(port) names a host this server routes
	// (test/autoresume.test.js reaches a port through it).
	s := startServer(t, "", append([]string{"--template", "base", "--e2b-domain", "sbx.test"}, flags...)...)
	var k, other key
	s.admin(&k, "admin", "key", "create", "--account", s.createAccount("e2b", false).ID, "--format", "e2b", "--json")
	// A second account's key: the SDK tests check that it sees none of the
	// first account's sandboxes.
	s.admin(&other, "admin", "key", "create", "--account", s.createAccount("e2b-other", false).ID, "--format", "e2b", "--json")
	if !strings.HasPrefix(k.Key, "e2b_") {
		t.Fatalf("key create --format e2b made %q, want an e2b_ key", k.Key)
	}
	runtimeName := "gvisor"
	if slices.Contains(flags, "microvm") {
		runtimeName = "microvm"
	}
	for _, sdk := range sdks {
		t.Run(sdk, func(t *testing.T) {
			env := map[string]string{
				"SDK":               sdk,
				"SANDBOXD_RUNTIME":  runtimeName,
				"E2B_API_URL":       s.base,
				"E2B_SANDBOX_URL":   s.base,
				"E2B_API_KEY":       k.Key,
				"E2B_OTHER_API_KEY": other.Key,
			}
			args := []string{"--test", "--test-reporter=spec"}
			if pattern := os.Getenv("SANDBOXD_E2B_TESTS"); pattern != "" {
				args = append(args, "--test-name-pattern="+pattern)
			}
			// The files of test/ only: code/ needs a server with the
			// code interpreter (TestCodeInterpreter runs it).
			files, err := filepath.Glob(filepath.Join(dir, "test", "*.test.js"))
			if err != nil || len(files) == 0 {
				t.Fatalf("no test files in %s/test: %v", dir, err)
			}
			for _, f := range files {
				args = append(args, filepath.Join("test", filepath.Base(f)))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
			defer cancel()
			if err := node.run(ctx, t, dir, env, node.bin, args...); err != nil {
				t.Fatalf("node --test with SDK=%s: %v", sdk, err)
			}
		})
	}
}

// nodeInstall is a Node.js found for the node tests (the e2b SDK's, the
// TypeScript client's).
type nodeInstall struct {
	bin     string // the node binary
	version string
}

// nodePrefixes are where scripts/install-node.sh installs Node.js when the
// system's is too old (as root, then as another user).
func nodePrefixes() []string {
	prefixes := []string{"/usr/local/lib/sandboxd/node"}
	if dir, err := os.UserCacheDir(); err == nil {
		prefixes = append(prefixes, filepath.Join(dir, "sandboxd", "node"))
	}
	return prefixes
}

// findNode returns the first Node.js that the SDK supports (>= 20.18.1,
// not 21.x, its "engines"), with npm beside it or on PATH: SANDBOXD_NODE if
// set, else the one on PATH, else install-node.sh's. Without one the test
// skips, or fails under SANDBOXD_REQUIRE_RUNTIME=1.
func findNode(t *testing.T) nodeInstall {
	t.Helper()
	var candidates []string
	if p := os.Getenv("SANDBOXD_NODE"); p != "" {
		candidates = append(candidates, p)
	} else {
		if p, err := exec.LookPath("node"); err == nil {
			candidates = append(candidates, p)
		}
		for _, prefix := range nodePrefixes() {
			candidates = append(candidates, filepath.Join(prefix, "bin", "node"))
		}
	}
	var seen []string
	for _, bin := range candidates {
		out, err := exec.Command(bin, "--version").Output()
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(out))
		seen = append(seen, bin+" "+v)
		if !nodeSupported(v) {
			continue
		}
		n := nodeInstall{bin: bin, version: v}
		if _, err := n.npm(); err != nil {
			seen[len(seen)-1] += " (no npm)"
			continue
		}
		t.Logf("node %s at %s", v, bin)
		return n
	}
	why := "no Node.js >= 20.18.1 with npm for the node tests (scripts/install-node.sh installs one)"
	if len(seen) > 0 {
		why += "; found: " + strings.Join(seen, ", ")
	}
	if os.Getenv("SANDBOXD_REQUIRE_RUNTIME") == "1" {
		t.Fatal(why + " (SANDBOXD_REQUIRE_RUNTIME=1)")
	}
	t.Skip(why)
	return nodeInstall{}
}

var nodeVersionRE = regexp.MustCompile(`^v(\d+)\.(\d+)\.(\d+)`)

// nodeSupported reports whether `node --version` output v is a version the
// SDK's engines allow: >= 20.18.1 <21 || >= 22.
func nodeSupported(v string) bool {
	m := nodeVersionRE.FindStringSubmatch(v)
	if m == nil {
		return false
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	patch, _ := strconv.Atoi(m[3])
	switch {
	case major >= 22:
		return true
	case major == 20:
		return minor > 18 || minor == 18 && patch >= 1
	}
	return false
}

// npm returns the npm to use with this node: the one beside it, else the one
// on PATH. Either is a node script run through PATH, so run puts this
// node's directory first.
func (n nodeInstall) npm() (string, error) {
	beside := filepath.Join(filepath.Dir(n.bin), "npm")
	if _, err := os.Stat(beside); err == nil {
		return beside, nil
	}
	return exec.LookPath("npm")
}

// run runs bin with args in dir, with this node first on PATH, the caller's
// environment less the E2B_* variables (which would point the SDK elsewhere)
// plus env, and streams its output into the test log line by line.
func (n nodeInstall) run(ctx context.Context, t *testing.T, dir string, env map[string]string, bin string, args ...string) error {
	t.Helper()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") && !strings.HasPrefix(kv, "PATH=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "PATH="+filepath.Dir(n.bin)+string(os.PathListSeparator)+os.Getenv("PATH"), "NO_COLOR=1")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	// A killed node leaves no child holding the pipe open past the deadline.
	cmd.WaitDelay = 10 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
		for sc.Scan() {
			t.Log(sc.Text())
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err := cmd.Run()
	pw.Close()
	<-done
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

// npmCI installs dir's dependencies (e2e/e2b, clients/typescript) from its
// lockfile with `npm ci`, unless node_modules was installed from this very
// lockfile by this node version already (a stamp file records both): npm
// ci removes and refetches node_modules each time.
func npmCI(t *testing.T, n nodeInstall, dir string) {
	t.Helper()
	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	// The node version is part of the stamp because which optional packages
	// npm installs depends on it (the SDK's undici8 wants node >= 22.19).
	sum := sha256.Sum256(append(lock, n.version...))
	want := hex.EncodeToString(sum[:])
	stamp := filepath.Join(dir, "node_modules", ".sandboxd-npm-ci")
	if have, err := os.ReadFile(stamp); err == nil && bytes.Equal(bytes.TrimSpace(have), []byte(want)) {
		return
	}
	npm, err := n.npm()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := n.run(ctx, t, dir, nil, npm, "ci", "--no-audit", "--no-fund"); err != nil {
		t.Fatalf("npm ci in %s: %v", dir, err)
	}
	if err := os.WriteFile(stamp, []byte(want+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// buildImage makes sure the template's image is in the cache, so that
// `serve --template` starts at once instead of building it past
// startServer's wait. A cached image takes a moment; a missing one is built
// (minutes, root and a Debian mirror).
func buildImage(t *testing.T, template string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, binary, "image", "build", "--template", template)
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) && os.Geteuid() != 0 && os.Getenv("SANDBOXD_REQUIRE_RUNTIME") != "1" {
			t.Skipf("the %s image is not built and building it needs root: %v\n%s", template, err, out.String())
		}
		t.Fatalf("sandboxd image build --template %s: %v\n%s", template, err, out.String())
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Logf("built the %s image in %s", template, d.Round(time.Second))
	}
}
