package main

import (
	"encoding/hex"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/guest"
)

// takeSecret returns the session secret the host gave this process
// (guest.SecretEnv) and erases every trace of it other processes in the
// sandbox could read: the variable leaves the Go environment, its bytes in
// the initial environment block (what /proc/1/environ shows) are zeroed,
// and the process becomes non-dumpable, so that without CAP_SYS_PTRACE
// (which sandboxes do not get) no one can read its memory or environment
// through /proc or ptrace. It runs first thing, before the agent starts any
// process.
func takeSecret() []byte {
	v, ok := os.LookupEnv(guest.SecretEnv)
	if !ok {
		return nil
	}
	env := os.Environ()
	_ = os.Unsetenv(guest.SecretEnv)
	scrubInitialEnv(env, guest.SecretEnv+"=")
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	secret, err := hex.DecodeString(v)
	if err != nil || len(secret) == 0 {
		return nil
	}
	return secret
}

// scrubInitialEnv zeroes the value of the variable with prefix in the
// process's initial environment block. The kernel laid out the argument
// strings and then the environment strings, each NUL-terminated, one after
// the other; os.Args still points into that block (the runtime does not
// copy arguments) while os.Environ holds copies. It walks the block after
// the last argument and gives up at the first byte that does not match
// env, so it never writes anywhere it has not recognised.
func scrubInitialEnv(env []string, prefix string) {
	if len(os.Args) == 0 {
		return
	}
	last := os.Args[len(os.Args)-1]
	if len(last) == 0 {
		return
	}
	p := unsafe.Add(unsafe.Pointer(unsafe.StringData(last)), len(last)+1)
	for _, e := range env {
		block := unsafe.Slice((*byte)(p), len(e)+1)
		if string(block[:len(e)]) != e || block[len(e)] != 0 {
			return
		}
		if strings.HasPrefix(e, prefix) {
			clear(block[len(prefix):len(e)])
		}
		p = unsafe.Add(p, len(e)+1)
	}
}
