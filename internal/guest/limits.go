package guest

import (
	"fmt"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Bounds on what an agent may answer. The agent runs inside the sandbox,
// where guest root can replace or impersonate it, so the host checks every
// reply against these and treats a violation as ErrProtocol: a reply can
// make the host allocate at most one MaxFrame, and nothing outside the
// protocol's ranges reaches host code (logs, stats, API responses).
const (
	// MaxListEntries is the most entries a directory listing carries; the
	// agent sends the first ones when a directory has more.
	MaxListEntries = 8192
	// MaxNameLen is the longest file name (NAME_MAX).
	MaxNameLen = 255
	// MaxPathLen is the longest path or symlink target (PATH_MAX).
	MaxPathLen = 4096
	// MaxPID is the largest pid Linux hands out (PID_MAX_LIMIT).
	MaxPID = 1 << 22
	// MaxErrorLen is how much of an agent's error text the host keeps.
	MaxErrorLen = 1024
	// maxHelloField bounds the free-text fields of a Hello.
	maxHelloField = 512
	// maxSignal is the largest Linux signal number (SIGRTMAX).
	maxSignal = 64
)

func protoErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrProtocol, fmt.Sprintf(format, args...))
}

// CheckHello validates an agent's Hello.
func CheckHello(h Hello) error {
	if h.PID <= 0 || h.PID > MaxPID {
		return protoErr("hello with pid %d", h.PID)
	}
	for name, v := range map[string]string{"agent": h.Agent, "kernel": h.Kernel, "boot": h.Boot} {
		if len(v) > maxHelloField || !utf8.ValidString(v) {
			return protoErr("hello with an invalid %s field (%d bytes)", name, len(v))
		}
	}
	return nil
}

// checkEntry validates one directory entry.
func checkEntry(fi FileInfo) error {
	if fi.Name == "" || fi.Name == "." || fi.Name == ".." || len(fi.Name) > MaxNameLen ||
		strings.ContainsAny(fi.Name, "/\x00") {
		return protoErr("directory entry with name %.64q", fi.Name)
	}
	return checkInfo(fi)
}

// checkInfo validates the fields of a FileInfo other than its name.
func checkInfo(fi FileInfo) error {
	if fi.Size < 0 {
		return protoErr("file of size %d", fi.Size)
	}
	if len(fi.Link) > MaxPathLen || strings.ContainsRune(fi.Link, 0) {
		return protoErr("symlink target of %d bytes", len(fi.Link))
	}
	return nil
}

// checkHealth validates a Ping answer.
func checkHealth(h Health) error {
	if math.IsNaN(h.Uptime) || math.IsInf(h.Uptime, 0) || h.Uptime < 0 {
		return protoErr("health with uptime %v", h.Uptime)
	}
	if h.Processes < 0 || h.Processes > MaxPID || h.MemTotal < 0 || h.MemFree < 0 {
		return protoErr("health with processes %d, memory %d/%d", h.Processes, h.MemFree, h.MemTotal)
	}
	return nil
}

// checkKilled validates an OOM kill report. PID 0 means nothing was killed.
func checkKilled(k Killed) error {
	if k.PID < 0 || k.PID > MaxPID || k.RSS < 0 {
		return protoErr("oom kill of pid %d (rss %d)", k.PID, k.RSS)
	}
	if len(k.Name) > maxHelloField {
		return protoErr("oom kill of a process named with %d bytes", len(k.Name))
	}
	return nil
}

// checkExit validates an exec's last frame.
func checkExit(e Exit) error {
	if e.Code < -1 || e.Code > 255 || e.Signal < 0 || e.Signal > maxSignal {
		return protoErr("exit with code %d, signal %d", e.Code, e.Signal)
	}
	return nil
}

// CleanText makes text from the agent safe to carry in host errors and
// logs: at most MaxErrorLen bytes of valid UTF-8 with no control characters
// (which could forge log lines or terminal escapes).
func CleanText(s string) string {
	if len(s) > MaxErrorLen {
		s = s[:MaxErrorLen] + "…"
	}
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || (unicode.IsControl(r) && r != '\t') {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
}
