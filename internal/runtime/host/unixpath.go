package host

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// maxSunPath is what a unix socket address holds (sockaddr_un.sun_path,
// its terminating NUL included).
const maxSunPath = 108

// UnixPath returns a name by which the unix socket at path can be
// dialled, and a release to call once dialled. A path that fits sun_path is
// its own name; a longer one (a data dir deep in the filesystem) is reached
// through an O_PATH descriptor of its directory, /proc/self/fd/N/NAME:
// dialled directly, it would fail with "invalid argument".
func UnixPath(path string) (name string, release func(), err error) {
	if len(path) < maxSunPath {
		return path, func() {}, nil
	}
	dir, base := filepath.Split(path)
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("open the directory of socket %s: %w", path, err)
	}
	name = "/proc/self/fd/" + strconv.Itoa(fd) + "/" + base
	if len(name) >= maxSunPath {
		unix.Close(fd)
		return "", nil, fmt.Errorf("socket name %q is too long for a unix socket address", base)
	}
	return name, func() { unix.Close(fd) }, nil
}

// DialUnix connects to the unix socket at path, however long the path.
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	name, release, err := UnixPath(path)
	if err != nil {
		return nil, err
	}
	defer release()
	var d net.Dialer
	return d.DialContext(ctx, "unix", name)
}
