package gvisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// The statx compatibility shim.
//
// runsc releases before 2023 answer statx with EINVAL when it is asked not
// to trigger automounts (AT_NO_AUTOMOUNT), which is exactly how coreutils 9
// (Debian bookworm) calls it: `ls`, `stat`, `cp -a` and friends then fail on
// every path with "Invalid argument". Python, git and Node.js use other
// calls and work. Until hosts run a newer gVisor, every sandbox preloads a
// tiny library (through /etc/ld.so.preload, bind-mounted read-only) that
// retries such a statx without the flag — meaningless inside gVisor, which
// has no automounts. On a kernel that accepts the flag the retry never
// happens. The library is compiled on the host with its C compiler when the
// runtime starts, once per content; without a compiler the runtime logs a
// warning and runs without it.
const statxShimSource = `/* Built by sandboxd: retry statx without AT_NO_AUTOMOUNT, which old gVisor rejects. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

struct statx;

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
	long r = syscall(SYS_statx, dirfd, path, flags, mask, buf);
	if (r == -1 && errno == EINVAL && (flags & AT_NO_AUTOMOUNT)) {
		r = syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
	}
	return (int)r;
}
`

// Guest paths of the shim and the preload list that names it.
const (
	guestStatxShim = guestBinDir + "/statx-compat.so"
	guestPreload   = "/etc/ld.so.preload"
)

// installStatxShim builds the shim into binDir (unless a build of this
// source is there) and writes the preload list beside it. It returns the
// host path of the preload list.
func installStatxShim(ctx context.Context, binDir string) (string, error) {
	sum := sha256.Sum256([]byte(statxShimSource))
	stamp := filepath.Join(binDir, "statx-compat."+hex.EncodeToString(sum[:8]))
	shim := filepath.Join(binDir, "statx-compat.so")
	preload := filepath.Join(binDir, "ld.so.preload")
	if _, err := os.Stat(stamp); err != nil {
		cc, err := exec.LookPath("cc")
		if err != nil {
			return "", fmt.Errorf("no C compiler to build the statx shim (apt-get install gcc): %w", err)
		}
		src := filepath.Join(binDir, "statx-compat.c")
		if err := os.WriteFile(src, []byte(statxShimSource), 0o644); err != nil {
			return "", err
		}
		tmp := shim + ".tmp"
		if out, err := exec.CommandContext(ctx, cc, "-shared", "-fPIC", "-O2", "-o", tmp, src).CombinedOutput(); err != nil {
			return "", fmt.Errorf("build the statx shim: %w: %s", err, out)
		}
		if err := os.Rename(tmp, shim); err != nil {
			return "", err
		}
		if err := os.WriteFile(stamp, nil, 0o644); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(preload, []byte(guestStatxShim+"\n"), 0o644); err != nil {
		return "", err
	}
	return preload, nil
}
