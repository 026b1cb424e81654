package e2e

import (
	"archive/tar"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestE2BSDKTemplate runs e2e/e2b/test/template.test.js: the official e2b
// JavaScript SDK's Template API (Template.build, buildInBackground,
// getBuildStatus, exists, tags) against a real sandboxd, then
// Sandbox.create from what it built, once per pinned SDK version. The
// base image is served by an in-process registry on loopback (the
// operator's flag allows it): the test root filesystem, with a /bin/bash
// that is busybox's sh (the SDK runs every command as `/bin/bash -l -c`)
// and an `ss` that answers E2B's waitForPort from busybox's netstat. A
// second registry demands basic authentication, for fromImage's
// credentials. Without a Node.js the test skips, as TestE2BSDK does.
func TestE2BSDKTemplate(t *testing.T) {
	node := findNode(t)
	dir, err := filepath.Abs("e2b")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, node, dir)

	img, err := mutate.AppendLayers(templateImage(t, v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}}), sdkShims(t))
	if err != nil {
		t.Fatal(err)
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref, err := name.ParseReference(strings.TrimPrefix(reg.URL, "http://") + "/apps/sdk:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	// The same image behind basic authentication.
	const user, pass = "sdk-user", "sdk-secret-3141"
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	private := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="registry"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	defer private.Close()
	privRef, err := name.ParseReference(strings.TrimPrefix(private.URL, "http://") + "/apps/private:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(privRef, img, remote.WithAuth(&authn.Basic{Username: user, Password: pass})); err != nil {
		t.Fatal(err)
	}

	s := startServer(t, filepath.Join(t.TempDir(), "e2b-sdk-template.db"), "--templates-allow-private-registries",
		"--network-pool", "10.246.0.0/16", "--e2b-domain", "sbx.test")
	var k key
	s.admin(&k, "admin", "key", "create", "--account", s.createAccount("e2b-tpl", false).ID, "--format", "e2b", "--json")
	sdks := []string{"new", "old"}
	if only := os.Getenv("SANDBOXD_E2B_SDK"); only != "" {
		sdks = []string{only}
	}
	for _, sdk := range sdks {
		t.Run(sdk, func(t *testing.T) {
			env := map[string]string{
				"SDK":                        sdk,
				"E2B_API_URL":                s.base,
				"E2B_SANDBOX_URL":            s.base,
				"E2B_API_KEY":                k.Key,
				"E2B_TEMPLATE_IMAGE":         ref.String(),
				"E2B_TEMPLATE_PRIVATE_IMAGE": privRef.String(),
				"E2B_TEMPLATE_REGISTRY_USER": user,
				"E2B_TEMPLATE_REGISTRY_PASS": pass,
				// copy, fromTemplate and credentials are sandboxd's:
				// their cases run, never skip.
				"E2B_TEMPLATE_REQUIRE_ALL": "1",
			}
			args := []string{"--test", "--test-reporter=spec", "--test-concurrency=1"}
			if pattern := os.Getenv("SANDBOXD_E2B_TESTS"); pattern != "" {
				args = append(args, "--test-name-pattern="+pattern)
			}
			args = append(args, "test/template.test.js")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
			defer cancel()
			if err := node.run(ctx, t, dir, env, node.bin, args...); err != nil {
				t.Fatalf("node --test template.test.js with SDK=%s: %v", sdk, err)
			}
		})
	}
	if strings.Contains(s.logs.String(), pass) {
		t.Error("the registry password is in the server's log")
	}
}

// sdkShims is a layer with what the SDK's commands need of an image:
// /bin/bash (busybox's sh takes -l and -c) and an ss that answers E2B's
// waitForPort (`ss -Htuln sport = :PORT`) from busybox's netstat.
func sdkShims(t *testing.T) v1.Layer {
	t.Helper()
	files := map[string]string{
		"bin/bash": "#!/bin/sh\nexec /bin/sh \"$@\"\n",
		"usr/bin/ss": "#!/bin/sh\n# ss -Htuln sport = :PORT, as E2B's waitForPort runs it\nport=\"${4#:}\"\n" +
			"netstat -tuln 2>/dev/null | awk -v p=\":$port\" 'index($4, p) == length($4) - length(p) + 1'\n",
	}
	return tarLayer(t, func(tw *tar.Writer) {
		for _, n := range []string{"bin/bash", "usr/bin/ss"} {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o755, Size: int64(len(files[n]))}); err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(tw, files[n]); err != nil {
				t.Fatal(err)
			}
		}
	})
}
