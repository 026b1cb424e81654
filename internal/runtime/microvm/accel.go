package microvm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime/host"
)

// kvmProbeTimeout bounds the KVM probe boot. On KVM the probe VM prints its
// marker in well under a second; on a host where KVM cannot run a stock
// guest (nested PVM) it hangs forever instead of failing.
const kvmProbeTimeout = 8 * time.Second

// probeMarker is what the agent's vm-init prints with sandboxd.probe=1.
const probeMarker = "sandboxd-probe-ok"

type accelCache struct {
	Key      string `json:"key"`
	Accel    string `json:"accel"`
	Rejected string `json:"rejected,omitempty"`
}

// chooseAccel returns "kvm" when a probe VM boots on KVM, else "tcg", with
// the reason KVM was rejected. The answer is cached in the state dir per
// QEMU, host kernel, guest kernel and initramfs: a failed KVM probe costs
// seconds.
func (r *Runtime) chooseAccel(ctx context.Context) (string, string, error) {
	if a := r.opts.Accel; a != "" {
		if a != "kvm" && a != "tcg" {
			return "", "", fmt.Errorf("unknown accelerator %q (kvm or tcg)", a)
		}
		return a, "", nil
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n", r.qemuVersion, hostKernel(), fileID(r.kernel), fileID(r.initrd))
	key := hex.EncodeToString(h.Sum(nil))
	cachePath := filepath.Join(r.StateDir(), "accel.json")
	var c accelCache
	if b, err := os.ReadFile(cachePath); err == nil && json.Unmarshal(b, &c) == nil && c.Key == key && c.Accel != "" {
		return c.Accel, c.Rejected, nil
	}
	accel, rejected := "kvm", ""
	if err := r.probeKVM(ctx); err != nil {
		if ctx.Err() != nil {
			return "", "", ctx.Err()
		}
		accel, rejected = "tcg", err.Error()
	}
	c = accelCache{Key: key, Accel: accel, Rejected: rejected}
	if b, err := json.Marshal(c); err == nil {
		_ = os.WriteFile(cachePath, b, 0o600)
	}
	return accel, rejected, nil
}

// hostKernel is the host kernel's release and version.
func hostKernel() string {
	release, version := host.Uname()
	return release + " " + version
}

// fileID identifies a file by size and mtime.
func fileID(p string) string {
	fi, err := os.Stat(p)
	if err != nil {
		return p
	}
	return fmt.Sprintf("%s %d %d", p, fi.Size(), fi.ModTime().UnixNano())
}

// probeKVM boots the guest kernel with the agent's probe mode on KVM and
// waits for its marker on the serial console.
func (r *Runtime) probeKVM(ctx context.Context) error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("no usable /dev/kvm: %w", err)
	}
	f.Close()
	pctx, cancel := context.WithTimeout(ctx, kvmProbeTimeout)
	defer cancel()
	cmd := exec.Command(r.qemu,
		"-nodefaults", "-no-user-config", "-display", "none",
		"-M", "microvm,acpi=off,x-option-roms=off", "-accel", "kvm", "-cpu", "host",
		"-smp", "1", "-m", "128M", "-kernel", r.kernel, "-initrd", r.initrd,
		"-append", "console=ttyS0 loglevel=4 reboot=t panic=-1 rdinit=/sandbox-agent sandboxd.probe=1 vm-init",
		"-serial", "stdio", "-no-reboot",
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	found := make(chan struct{})
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		buf := make([]byte, 4096)
		for {
			n, err := pr.Read(buf)
			out.Write(buf[:n])
			if bytes.Contains(out.Bytes(), []byte(probeMarker)) {
				close(found)
				_, _ = io.Copy(io.Discard, pr)
				return
			}
			if err != nil {
				return
			}
		}
	}()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start probe VM: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); pw.Close() }()
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}()
	select {
	case <-found:
		r.log.Info("KVM probe VM booted", "elapsed", time.Since(start).Round(time.Millisecond))
		return nil
	case err := <-exited:
		select {
		case <-found:
			return nil
		case <-time.After(100 * time.Millisecond):
		}
		<-readDone
		return fmt.Errorf("probe VM on KVM failed (%v): %s", err, host.LastLine(out.String()))
	case <-pctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		<-readDone
		if ctx.Err() != nil {
			return ctx.Err()
		}
		msg := fmt.Sprintf("probe VM did not boot on KVM within %v (a host whose KVM cannot run this guest, e.g. nested PVM, hangs)", kvmProbeTimeout)
		if l := host.LastLine(out.String()); l != "" {
			msg += "; last output: " + l
		}
		return errors.New(msg)
	}
}
