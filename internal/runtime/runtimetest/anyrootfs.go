package runtimetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/busybox"
)

// ImageUser is the user of ImageRootfs's image: uid and gid 1000, home
// /home/app (0750, its own), where a file only it may read is.
const ImageUser = "app"

// ImageRootfs builds, in a test temp dir, a root filesystem like an
// unpacked OCI image's rather than one sandboxd built: the busybox tree
// without /dev, /proc and /sys (an image need not have its mount points),
// a user "app" (uid 1000) whose home and files are its own, a setuid-root
// program (/opt/tool/bin/euid prints its effective uid), a script with a
// hard link (/opt/tool/bin/hello, hello2) and a relative and an absolute
// symlink to it (/usr/local/bin/hello, /usr/bin/hi). It needs root (to
// chown) and the go tool (for euid).
func ImageRootfs(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "image")
	if err := busybox.BuildRootfs(dir); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"dev", "proc", "sys"} {
		must(os.RemoveAll(filepath.Join(dir, d)))
	}
	appendTo := func(name, line string) {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_APPEND|os.O_WRONLY, 0)
		must(err)
		_, err = f.WriteString(line)
		must(err)
		must(f.Close())
	}
	appendTo("etc/passwd", ImageUser+":x:1000:1000:app:/home/app:/bin/sh\n")
	appendTo("etc/group", ImageUser+":x:1000:\n")
	home := filepath.Join(dir, "home", ImageUser)
	must(os.MkdirAll(home, 0o750))
	must(os.WriteFile(filepath.Join(home, "note"), []byte("for app only\n"), 0o600))
	must(os.Chown(filepath.Join(home, "note"), 1000, 1000))
	must(os.Chown(home, 1000, 1000))
	must(os.Chmod(home, 0o750))

	bin := filepath.Join(dir, "opt", "tool", "bin")
	must(os.MkdirAll(bin, 0o755))
	must(os.WriteFile(filepath.Join(bin, "hello"), []byte("#!/bin/sh\necho \"hello from the image as $(id -u)\"\n"), 0o755))
	must(os.Link(filepath.Join(bin, "hello"), filepath.Join(bin, "hello2")))
	must(os.MkdirAll(filepath.Join(dir, "usr", "local", "bin"), 0o755))
	must(os.Symlink("../../../opt/tool/bin/hello", filepath.Join(dir, "usr", "local", "bin", "hello")))
	must(os.Symlink("/opt/tool/bin/hello", filepath.Join(dir, "usr", "bin", "hi")))
	must(euidBinary(filepath.Join(bin, "euid")))
	must(os.Chmod(filepath.Join(bin, "euid"), 0o755|os.ModeSetuid))
	return dir
}

var euidOnce struct {
	sync.Once
	b   []byte
	err error
}

// euidBinary writes a static program that prints its effective uid to out.
func euidBinary(out string) error {
	euidOnce.Do(func() {
		dir, err := os.MkdirTemp("", "euid-")
		if err != nil {
			euidOnce.err = err
			return
		}
		defer os.RemoveAll(dir)
		src := "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() { fmt.Println(os.Geteuid()) }\n"
		if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
			euidOnce.err = err
			return
		}
		cmd := exec.Command("go", "build", "-o", "euid", "main.go")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
		if b, err := cmd.CombinedOutput(); err != nil {
			euidOnce.err = fmt.Errorf("build euid: %w\n%s", err, b)
			return
		}
		euidOnce.b, euidOnce.err = os.ReadFile(filepath.Join(dir, "euid"))
	})
	if euidOnce.err != nil {
		return euidOnce.err
	}
	return os.WriteFile(out, euidOnce.b, 0o755)
}

// CheckImageRootfs checks a sandbox started on ImageRootfs's directory:
// owners, modes, the setuid bit, the hard link and the symlinks are the
// image's, and commands run as its user. It returns the effective uid the
// setuid-root program ran with as that user: "0" where the backend honours
// setuid bits (the microVM's kernel does; Debian's 2022 runsc does not).
func CheckImageRootfs(t *testing.T, sb runtime.Sandbox) (setuidEUID string) {
	t.Helper()
	run := func(user, script string) string {
		t.Helper()
		var out, errb bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"/bin/sh", "-c", script}, User: user, Cwd: "/", Stdout: &out, Stderr: &errb})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s as %q: exit %d, %v\nstdout: %s\nstderr: %s", script, user, res.ExitCode, err, out.String(), errb.String())
		}
		return out.String()
	}
	got := run("", "stat -c '%n %u:%g %a' /home/app /home/app/note /opt/tool/bin/euid /opt/tool/bin/hello; "+
		"stat -c '%h %i' /opt/tool/bin/hello /opt/tool/bin/hello2; readlink /usr/local/bin/hello; readlink /usr/bin/hi; "+
		"test -d /proc/self && test -d /sys/kernel && test -c /dev/null && echo mounts")
	want := "/home/app 1000:1000 750\n/home/app/note 1000:1000 600\n/opt/tool/bin/euid 0:0 4755\n/opt/tool/bin/hello 0:0 755\n"
	if !strings.HasPrefix(got, want) {
		t.Fatalf("owners and modes:\n%s\nwant first:\n%s", got, want)
	}
	rest := strings.Split(strings.TrimPrefix(got, want), "\n")
	if len(rest) < 5 || rest[0] != rest[1] || !strings.HasPrefix(rest[0], "2 ") ||
		rest[2] != "../../../opt/tool/bin/hello" || rest[3] != "/opt/tool/bin/hello" || rest[4] != "mounts" {
		t.Fatalf("hard link, symlinks, mount points:\n%s", got)
	}
	if got := run(ImageUser, "id -u; id -g; cat ~/note; hello; hi; /opt/tool/bin/hello2"); got !=
		"1000\n1000\nfor app only\nhello from the image as 1000\nhello from the image as 1000\nhello from the image as 1000\n" {
		t.Fatalf("as %s:\n%s", ImageUser, got)
	}
	// Another user may not read app's files.
	if got := run("nobody", "cat /home/app/note 2>/dev/null || echo denied"); got != "denied\n" {
		t.Fatalf("as nobody:\n%s", got)
	}
	// What the user writes is its own.
	if got := run(ImageUser, "echo x > ~/new && stat -c '%u:%g' ~/new"); got != "1000:1000\n" {
		t.Fatalf("a new file of %s: %s", ImageUser, got)
	}
	return strings.TrimSpace(run(ImageUser, "/opt/tool/bin/euid"))
}

// testAnyRootFS: a backend with Capabilities().AnyRootFS starts a sandbox
// on a directory like an unpacked OCI image (ImageRootfs).
func (s *suite) testAnyRootFS(t *testing.T) {
	if !s.rt.Capabilities().AnyRootFS {
		t.Skip("the backend starts only its own root filesystems")
	}
	sb := s.create(t, runtime.Spec{BaseDir: ImageRootfs(t), BaseImage: "oci:image-fixture"})
	euid := CheckImageRootfs(t, sb)
	t.Logf("a setuid-root program run by uid 1000 has euid %s", euid)
}
