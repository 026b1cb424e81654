//go:build linux && !386 && !arm

// The syscall numbers below are those with 32-bit ids; on 386 and arm
// they are the legacy 16-bit calls (a uid over 65535 would be cut short),
// so the file is left out there and the package does not build rather
// than act as the wrong user.

package agent

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Acting as a user on the filesystem.
//
// The agent runs as root. A request that names a user (guest.UserHeader)
// must reach the filesystem with that user's rights, so that the kernel —
// not the agent — decides what the user may open, create, rename or
// remove, and resolves every path (symlinks planted by the sandbox's
// processes included) as that user: doing the work as root and chowning
// afterwards let a user write where it may not (into /root) and let a
// symlink redirect a root write.
//
// Credentials on Linux belong to a thread, not a process: setuid(2) and
// setgroups(2) are per-process only because libc and Go's syscall package
// repeat them on every thread (Go's syscall.Setgroups and Setresuid go
// through AllThreadsSyscall, or libc's broadcast with cgo). asUser
// instead runs the work on a goroutine locked to its OS thread and changes
// that thread alone with the raw system calls, then lets the goroutine end
// still locked, which makes the runtime end the thread rather than hand it
// to other goroutines. Threads the runtime creates while a goroutine is
// locked are cloned by its template thread, not by the locked one (Go ≥
// 1.10), so the credentials do not spread either.
//
// Which ids: the effective ones (setresuid/setresgid with real and saved
// ids left at 0) and the supplementary groups. Not setfsuid/setfsgid,
// although they are the calls made for this on Linux: gVisor, where the
// agent runs in production, does not implement them (ENOSYS,
// gvisor.dev/issue/260; its VFS checks the effective ids, as it has no
// filesystem ids), while it does keep per-thread effective ids and groups
// as Linux does. On Linux the filesystem ids follow the effective ones.
// Changing the effective uid from 0 clears the thread's effective
// capabilities (capabilities(7); gVisor implements the same rule), so no
// CAP_DAC_OVERRIDE, CAP_FOWNER or CAP_CHOWN lets the kernel skip a check.
// The real and saved uids stay 0 so that, to the rest of the system, the
// process is still root's: a user's process cannot signal or ptrace it
// (those checks look at the target's real and saved ids).
//
// Every change is verified by reading it back, and anything unexpected —
// a call the kernel does not implement, ids or groups that did not take,
// capabilities left in the effective set — fails the request with
// errNoUser: the work is never done as root instead.

// errNoUser is the failure to take on a user's credentials: the agent's
// fault or its kernel's, never the caller's (500 / Internal).
var errNoUser = errors.New("cannot act as the user")

// asUser runs fn with u's credentials for the filesystem, or, for a nil
// u, as the agent itself on the calling goroutine. fn must not start
// goroutines that touch the filesystem on u's behalf (they run on other
// threads, as root) and must not keep using the thread after it returns.
//
// A panic in fn is returned as an error: fn runs on a goroutine of its
// own, where an unrecovered panic would end the agent (PID 1).
func asUser(u *account, fn func() error) error {
	// Root is the agent's own identity: nothing to switch (and switching
	// the effective uid to 0 would keep every capability, which the
	// check below rightly refuses).
	if u == nil || u.uid == 0 {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		// Never unlocked: when this goroutine returns, the runtime ends
		// the thread with u's credentials instead of reusing it.
		runtime.LockOSThread()
		defer func() {
			if p := recover(); p != nil {
				done <- fmt.Errorf("acting as user %q: panic: %v", u.name, p)
			}
		}()
		if err := becomeUser(u); err != nil {
			done <- fmt.Errorf("%w %q: %w", errNoUser, u.name, err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// becomeUser gives the calling thread, which must be locked to its
// goroutine, u's effective ids and groups, and checks that they took.
func becomeUser(u *account) error {
	if len(u.groups) == 0 {
		return errors.New("no groups") // lookupUser always lists the primary one
	}
	gids := slices.Clone(u.groups) // uint32: the kernel's gid_t
	// Groups and gid first: setgroups and setresgid need CAP_SETGID, which
	// the thread loses with its effective uid.
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(gids)), uintptr(unsafe.Pointer(&gids[0])), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keepID, uintptr(u.gid), keepID); e != 0 {
		return fmt.Errorf("setresgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keepID, uintptr(u.uid), keepID); e != 0 {
		return fmt.Errorf("setresuid: %w", e)
	}
	return checkUser(u)
}

// keepID is -1 as a uid_t or gid_t argument: leave that id as it is.
const keepID = uintptr(^uint32(0))

// checkUser reads the calling thread's credentials back and fails unless
// they are u's: its effective uid and gid, exactly u's groups, filesystem
// ids that follow (where the kernel has them) and no effective
// capabilities.
func checkUser(u *account) error {
	var r, e, s uint32
	if _, _, errno := unix.RawSyscall(unix.SYS_GETRESUID, uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&e)), uintptr(unsafe.Pointer(&s))); errno != 0 {
		return fmt.Errorf("getresuid: %w", errno)
	}
	if e != u.uid {
		return fmt.Errorf("effective uid is %d after setresuid(%d)", e, u.uid)
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_GETRESGID, uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&e)), uintptr(unsafe.Pointer(&s))); errno != 0 {
		return fmt.Errorf("getresgid: %w", errno)
	}
	if e != u.gid {
		return fmt.Errorf("effective gid is %d after setresgid(%d)", e, u.gid)
	}
	got := make([]uint32, len(u.groups)+1) // room to see one too many
	n, _, errno := unix.RawSyscall(unix.SYS_GETGROUPS, uintptr(len(got)), uintptr(unsafe.Pointer(&got[0])), 0)
	if errno != 0 {
		return fmt.Errorf("getgroups: %w", errno)
	}
	got = got[:n]
	want := slices.Clone(u.groups)
	slices.Sort(got) // the kernel keeps groups sorted, not in our order
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return fmt.Errorf("groups are %v after setgroups(%v)", got, want)
	}
	// setfsuid(-1) changes nothing and returns the filesystem uid. Linux
	// moves it with the effective uid; gVisor has none (ENOSYS) and checks
	// the effective uid itself.
	for _, c := range []struct {
		name string
		nr   uintptr
		want uint32
	}{{"setfsuid", unix.SYS_SETFSUID, u.uid}, {"setfsgid", unix.SYS_SETFSGID, u.gid}} {
		fs, _, errno := unix.RawSyscall(c.nr, keepID, 0, 0)
		switch {
		case errno == unix.ENOSYS:
		case errno != 0:
			return fmt.Errorf("%s: %w", c.name, errno)
		case uint32(fs) != c.want:
			return fmt.Errorf("filesystem id is %d, not %d", uint32(fs), c.want)
		}
	}
	// With any capability left (a kernel without the setuid fixup, or
	// SECBIT_NO_SETUID_FIXUP) CAP_DAC_OVERRIDE and the like would make the
	// ids above meaningless.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	if caps[0].Effective != 0 || caps[1].Effective != 0 {
		return fmt.Errorf("effective capabilities %#x %#x left after setresuid", caps[1].Effective, caps[0].Effective)
	}
	return nil
}
