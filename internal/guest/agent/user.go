package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/guest"
)

// account is the sandbox user a request acts as (guest.UserHeader).
type account struct {
	name     string
	uid, gid uint32
	groups   []uint32 // supplementary groups, the primary one first
	home     string
}

// maxUserName bounds guest.UserHeader's value (useradd's own limit).
const maxUserName = 32

// badUserError is a guest.UserHeader that names no user the agent can act
// as: the caller's mistake (InvalidArgument; 400 from /files).
type badUserError struct{ msg string }

func (e *badUserError) Error() string { return e.msg }

func badUser(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, &badUserError{fmt.Sprintf(format, args...)})
}

// requestUser is the user a request names in guest.UserHeader, nil
// without the header. Only the host sets it, over the agent's private
// session, so it needs no proof; but a value that names no user is an
// error, never a silent fall back to the agent's own (root).
func (a *Agent) requestUser(h http.Header) (*account, error) {
	vs := h.Values(guest.UserHeader)
	if len(vs) == 0 || len(vs) == 1 && vs[0] == "" {
		return nil, nil
	}
	// Two values would leave which one counts to chance (a proxy that
	// added the header to a caller's own).
	if len(vs) > 1 {
		return nil, badUser("%d %s headers", len(vs), guest.UserHeader)
	}
	name := vs[0]
	if !validUserName(name) {
		return nil, badUser("user name %q is not valid", name)
	}
	return lookupUser(a.opts.UserDB, name)
}

// validUserName accepts the portable user names (letters, digits, '.',
// '_' and '-', not first): nothing that could split a line of passwd or
// group, and nothing a shell would read as an option.
func validUserName(name string) bool {
	if name == "" || len(name) > maxUserName {
		return false
	}
	for i, c := range []byte(name) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_':
		case (c >= '0' && c <= '9' || c == '.' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// lookupUser reads name's entry in etc/passwd and its groups in etc/group
// (the sandbox's own files: the agent is static, without NSS, and os/user
// could not be pointed at a test's database).
func lookupUser(etc, name string) (*account, error) {
	var u *account
	var bad error
	err := scanDB(filepath.Join(etc, "passwd"), func(f []string) bool {
		if f[0] != name {
			return false
		}
		if len(f) != 7 {
			bad = badUser("user %q: malformed passwd entry", name)
			return true
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		switch {
		case err1 != nil || err2 != nil:
			bad = badUser("user %q: malformed passwd entry", name)
		case !filepath.IsAbs(f[5]):
			bad = badUser("user %q: home %q is not an absolute path", name, f[5])
		default:
			u = &account{name: name, uid: uint32(uid), gid: uint32(gid), groups: []uint32{uint32(gid)}, home: filepath.Clean(f[5])}
		}
		return true
	})
	switch {
	case err != nil:
		return nil, badUser("user %q: %v", name, err)
	case bad != nil:
		return nil, bad
	case u == nil:
		return nil, badUser("user %q does not exist", name)
	}
	err = scanDB(filepath.Join(etc, "group"), func(f []string) bool {
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil || len(f) != 4 || !slices.Contains(strings.Split(f[3], ","), name) {
			return false
		}
		if !slices.Contains(u.groups, uint32(gid)) {
			u.groups = append(u.groups, uint32(gid))
		}
		return false
	})
	// A user may have no group file to be in; one that cannot be read
	// would drop groups the user has.
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, badUser("user %q: %v", name, err)
	}
	return u, nil
}

// scanDB calls fn with the fields of each entry of a passwd-style file
// (at least three, ':'-separated) until it returns true. Comments and
// NIS lines ('+', '-') are skipped.
func scanDB(path string, fn func(fields []string) bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20) // a group with many members is a long line
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.ContainsAny(line[:1], "#+-") {
			continue
		}
		if fields := strings.Split(line, ":"); len(fields) >= 3 && fn(fields) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}

// env is what a process of u's has of its own: HOME, USER, LOGNAME.
func (u *account) env() []string {
	if u == nil {
		return nil
	}
	return []string{"HOME=" + u.home, "USER=" + u.name, "LOGNAME=" + u.name}
}

// credential makes a process run as u, with exactly u's groups.
func (u *account) credential() *syscall.Credential {
	return &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
}
