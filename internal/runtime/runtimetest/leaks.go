package runtimetest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/internal/mountinfo"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// HostLeaks is a Harness.Leaks for a backend on the state directory layout
// of package host (ids/<id> -> sandboxes/<cid>, host cgroup
// sandboxd/<cid>). Before the destroy it finds the sandbox's container id;
// after, it lists what is left of it: the id link, the directory, mounts
// under it, cgroups (v1 and v2), and what extra (nil: nothing) lists of
// the backend's own (processes, containers).
func HostLeaks(extra func(t *testing.T, stateDir, cid string) []string) func(t *testing.T, stateDir string, sb runtime.Sandbox) func() []string {
	return func(t *testing.T, stateDir string, sb runtime.Sandbox) func() []string {
		link := filepath.Join(stateDir, "ids", sb.ID())
		target, err := os.Readlink(link)
		if err != nil {
			t.Fatalf("find the container of %s: %v", sb.ID(), err)
		}
		cid := filepath.Base(target)
		return func() []string {
			var out []string
			dir := filepath.Join(stateDir, "sandboxes", cid)
			if _, err := os.Lstat(link); err == nil {
				out = append(out, "id link")
			}
			if _, err := os.Stat(dir); err == nil {
				out = append(out, "directory "+dir)
			}
			mounts, _ := mountinfo.Under(dir)
			for _, m := range mounts {
				out = append(out, "mount "+m)
			}
			cg, _ := filepath.Glob("/sys/fs/cgroup/*/sandboxd/" + cid)
			cg2, _ := filepath.Glob("/sys/fs/cgroup/sandboxd/" + cid)
			for _, d := range append(cg, cg2...) {
				out = append(out, "cgroup "+d)
			}
			if extra != nil {
				out = append(out, extra(t, stateDir, cid)...)
			}
			return out
		}
	}
}
