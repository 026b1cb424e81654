package gvisor

import (
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BundledRunsc is where scripts/install-runsc.sh installs a current gVisor,
// pinned and built with CGO_ENABLED=0. The backend prefers it when no runsc
// is named and a trial sandbox boots with it; Debian's runsc (2022) in PATH
// is the fallback.
const BundledRunsc = "/usr/local/lib/sandboxd/runsc"

// RunscInfo says which runsc the backend runs, and why.
type RunscInfo struct {
	Path    string `json:"path"`
	Version string `json:"version"`
	// Reason is why this one was chosen.
	Reason string `json:"reason"`
	// Rejected are the other candidates (by path) and why each was not.
	Rejected map[string]string `json:"rejected,omitempty"`
	// The workarounds for Debian's 2022 runsc that this one needs (see
	// probeResult).
	StatxShim       bool `json:"statx_shim"`
	NetnsWorkaround bool `json:"netns_workaround"`
	// NoTTYSignals: its terminals send no signals for ^C, ^\ and ^Z; the
	// agent sends them (probeResult.NoTTYSignals).
	NoTTYSignals bool `json:"no_tty_signals"`
}

// String is a one-line summary for logs and reports.
func (i RunscInfo) String() string {
	return fmt.Sprintf("runsc %s (%s)", i.Version, i.Path)
}

// DefaultRunsc is the runsc a bare benchmark runs beside the backend when
// none is named: BundledRunsc when installed, else runsc in PATH. It does
// not try either (New does).
func DefaultRunsc() string {
	if fi, err := os.Stat(BundledRunsc); err == nil && fi.Mode()&0o111 != 0 {
		return BundledRunsc
	}
	return "runsc"
}

type runscCandidate struct{ path, reason string }

// runscCandidates lists the runsc binaries to try, best first, and those
// ruled out before any trial. An explicit one is the only candidate: the
// operator asked for it, and a silent fallback would hide a mistake.
func runscCandidates(opts Options) ([]runscCandidate, map[string]string) {
	rejected := map[string]string{}
	if opts.RunscPath != "" {
		return []runscCandidate{{opts.RunscPath, "named explicitly (--runsc, SANDBOXD_RUNSC or Options.RunscPath)"}}, rejected
	}
	bundled := opts.BundledRunsc
	if bundled == "" {
		bundled = BundledRunsc
	}
	var out []runscCandidate
	if fi, err := os.Stat(bundled); err != nil {
		rejected[bundled] = "not installed (scripts/install-runsc.sh installs it)"
	} else if fi.Mode()&0o111 == 0 {
		rejected[bundled] = "not executable"
	} else {
		out = append(out, runscCandidate{bundled, "the current gVisor installed by scripts/install-runsc.sh; a trial sandbox boots with it"})
	}
	if p, err := exec.LookPath("runsc"); err == nil && !sameFile(p, bundled) {
		reason := "runsc in PATH"
		if len(out) > 0 {
			reason += ", the fallback"
		}
		out = append(out, runscCandidate{p, reason})
	} else if err != nil {
		rejected["runsc in PATH"] = "not found (apt-get install runsc)"
	}
	return out, rejected
}

func sameFile(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// runscVersion is what `runsc --version` says on its first line, without
// "runsc version ". A runsc built by a plain `go install` says
// VERSION_MISSING; its Go build info names the gVisor module version
// instead, which tells builds apart as well.
func runscVersion(ctx context.Context, path string) (string, error) {
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", path, err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	v := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "runsc version"))
	if v != "" && v != "VERSION_MISSING" {
		return v, nil
	}
	if bi, err := buildinfo.ReadFile(path); err == nil {
		if bi.Main.Path == "gvisor.dev/gvisor" && bi.Main.Version != "" {
			return bi.Main.Version, nil
		}
		for _, d := range bi.Deps {
			if d.Path == "gvisor.dev/gvisor" {
				return d.Version, nil
			}
		}
	}
	if v == "" {
		return "", fmt.Errorf("%s --version: no version in %q", path, out)
	}
	return v, nil
}

// chooseRunsc picks the runsc binary and its platform (see
// runscCandidates), probing each candidate in turn; r.log says which was
// chosen and why the others were not.
func (r *Runtime) chooseRunsc(ctx context.Context) (probeResult, error) {
	cands, rejected := runscCandidates(r.opts)
	var errs []error
	for _, c := range cands {
		version, err := runscVersion(ctx, c.path)
		if err == nil {
			var pr probeResult
			if pr, err = r.probe(ctx, c.path, version, r.opts.Platform); err == nil {
				r.runsc = RunscInfo{
					Path: c.path, Version: version, Reason: c.reason, Rejected: rejected,
					StatxShim: pr.StatxShim, NetnsWorkaround: pr.NetnsWorkaround, NoTTYSignals: pr.NoTTYSignals,
				}
				return pr, nil
			}
		}
		rejected[c.path] = err.Error()
		errs = append(errs, fmt.Errorf("%s: %w", c.path, err))
		r.log.Warn("gvisor runtime: runsc rejected", "runsc", c.path, "reason", err)
	}
	if len(errs) == 0 {
		return probeResult{}, fmt.Errorf("no runsc: %v", rejected)
	}
	return probeResult{}, errors.Join(errs...)
}

// legacyRunsc is the runsc that made a sandbox whose meta predates
// meta.Runsc: the one named, else the one in PATH, as sandboxd chose then.
func legacyRunsc(opts Options, chosen string) string {
	if opts.RunscPath != "" {
		return opts.RunscPath
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs
		}
		return p
	}
	return chosen
}

// Degradation is one way this backend does less than it would with the
// current gVisor on a platform that suits it.
type Degradation struct {
	// Summary says what is wrong and what is lost, for anyone (GET
	// /api/health answers it): versions and remedies, never a host path.
	Summary string
	// Detail is why, for the operator's log: the rejected candidates'
	// errors as they were, host paths included.
	Detail string
}

// Degraded lists what this runtime lacks: a fallback from the current
// gVisor (scripts/install-runsc.sh) to another runsc, the old runsc's
// faults and workarounds, sandbox networks that cannot start, and a slow
// platform chosen because a faster one failed its trial. Empty when
// nothing is lost. A choice the operator made (--runsc, --gvisor-platform)
// is no fallback, but what the runsc it names lacks is still said.
func (r *Runtime) Degraded() []Degradation {
	var out []Degradation
	if d, ok := r.fallback(); ok {
		out = append(out, d)
	}
	if r.runsc.StatxShim || r.runsc.NetnsWorkaround {
		out = append(out, r.oldRunsc())
	}
	if r.networkError != "" {
		out = append(out, Degradation{
			Summary: fmt.Sprintf("gVisor: sandboxes with a network cannot start on runsc %s (sandboxes without one work)", r.runsc.Version),
			Detail:  r.networkError,
		})
	}
	if p := r.slowPlatform(); p != nil {
		out = append(out, *p)
	}
	return out
}

// fallback is the degradation of running another runsc than the current
// gVisor because that one was not installed or did not boot.
func (r *Runtime) fallback() (Degradation, bool) {
	bundled := r.opts.BundledRunsc
	if bundled == "" {
		bundled = BundledRunsc
	}
	why, rejected := r.runsc.Rejected[bundled]
	if r.opts.RunscPath != "" || !rejected || r.runsc.Path == bundled {
		return Degradation{}, false
	}
	var public string
	switch {
	case strings.HasPrefix(why, "not installed"):
		public = "is not installed (scripts/install-runsc.sh installs it; make run and make deps run it)"
	case strings.HasPrefix(why, "not executable"):
		public = "is not executable (scripts/install-runsc.sh installs it again)"
	default:
		public = "did not boot its trial sandbox (serve's log says why; scripts/install-runsc.sh builds it again)"
	}
	return Degradation{
		Summary: fmt.Sprintf("gVisor fell back to runsc %s: the current gVisor %s", r.runsc.Version, public),
		Detail:  fmt.Sprintf("%s rejected: %s; running %s", bundled, why, r.runsc.Path),
	}, true
}

// oldRunsc is the degradation of a runsc as old as Debian 12's (December
// 2022), which the probe tells by the workarounds it needs.
func (r *Runtime) oldRunsc() Degradation {
	lost := []string{"pause and fork refuse a sandbox while TCP sockets are open in it",
		"a fork pauses its parent and restores it (its processes carry on; about 2 s)",
		"a path through a symlink to / resolves to / itself"}
	if r.runsc.NoTTYSignals {
		lost = append(lost, "terminals turn ^C, ^\\ and ^Z into signals only through the agent (runsc's own line discipline does not)")
	}
	if r.runsc.StatxShim {
		if r.preload == "" {
			lost = append(lost, "ls and stat fail inside (statx with AT_NO_AUTOMOUNT; the shim that works around it could not be built)")
		} else {
			lost = append(lost, "statx needs a shim preloaded in every sandbox (ls and stat)")
		}
	}
	if r.runsc.NetnsWorkaround {
		lost = append(lost, "sandbox networks start only with /proc/sys/net hidden from runsc")
	}
	return Degradation{
		Summary: fmt.Sprintf("gVisor: runsc %s is as old as Debian 12's (December 2022): %s; the current gVisor has none of these (scripts/install-runsc.sh)",
			r.runsc.Version, strings.Join(lost, "; ")),
		Detail: fmt.Sprintf("%s needs the statx shim: %v, the network-namespace workaround: %v", r.runsc.Path, r.runsc.StatxShim, r.runsc.NetnsWorkaround),
	}
}

// slowPlatform is the degradation of running on ptrace because systrap
// failed its trial or this runsc lacks it; nil when the platform is the
// operator's choice or a fast one.
func (r *Runtime) slowPlatform() *Degradation {
	if r.opts.Platform != "" || r.platform != "ptrace" {
		return nil
	}
	why, ok := r.rejected["systrap"]
	if !ok {
		return nil
	}
	public := "failed its trial sandbox (serve's log says why)"
	if why == "not supported by this runsc" {
		public = "is not supported by this runsc"
	}
	return &Degradation{
		Summary: fmt.Sprintf("gVisor runs on the ptrace platform: systrap %s; syscall-heavy work (git, Python imports, npm) is about 2-3 times slower", public),
		Detail:  fmt.Sprintf("systrap rejected: %s", why),
	}
}
