package microvm

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

func TestVMLimits(t *testing.T) {
	cases := []struct {
		name      string
		l         runtime.Limits
		tcg       bool
		wantMiB   int64
		wantCPUs  int
		wantHostM int64 // MiB
	}{
		{"small kvm", runtime.Limits{CPUs: 1, MemoryBytes: 256 << 20}, false, 256 + 96 + 4, 1, 256 + 96 + 4 + 192},
		{"fraction of a cpu rounds up", runtime.Limits{CPUs: 0.5, MemoryBytes: 128 << 20}, false, 128 + 96 + 2, 1, 128 + 96 + 2 + 192},
		{"tcg adds its cache", runtime.Limits{CPUs: 2, MemoryBytes: 2 << 30}, true, 2048 + 96 + 32, 2, 2048 + 96 + 32 + 192 + tcgCacheMiB},
		{"odd bytes round up", runtime.Limits{CPUs: 1.5, MemoryBytes: 100<<20 + 1}, false, 101 + 96 + 1, 2, 101 + 96 + 1 + 192},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mib, cpus, host := vmLimits(tc.l, tc.tcg)
			if mib != tc.wantMiB || cpus != tc.wantCPUs || host.memory != tc.wantHostM<<20 || host.cpus != tc.l.CPUs {
				t.Errorf("got %d MiB, %d vCPUs, host %+v", mib, cpus, host)
			}
		})
	}
}

func TestCommandLines(t *testing.T) {
	c := vmConfig{Accel: "tcg", MemMiB: 356, VCPUs: 2, TSCKHz: 2593904, Hostname: "box", Pids: 63, Memory: 256 << 20}
	cmdline := c.kernelCmdline()
	for _, want := range []string{"rdinit=/sandbox-agent", "mitigations=off", "tsc_early_khz=2593904", "sandboxd.hostname=box",
		"sandboxd.pids=63", "sandboxd.memory=268435456", "sandboxd.port=sandboxd"} {
		if !strings.Contains(cmdline, want) {
			t.Errorf("cmdline %q lacks %q", cmdline, want)
		}
	}
	// QEMU appends the virtio-mmio devices: nothing may end the kernel's
	// parameters early.
	if strings.Contains(cmdline, " -- ") || !strings.HasSuffix(cmdline, " vm-init") {
		t.Errorf("cmdline %q", cmdline)
	}
	c.Accel = "kvm"
	if k := c.kernelCmdline(); strings.Contains(k, "mitigations=off") || strings.Contains(k, "tsc_early_khz") {
		t.Errorf("kvm cmdline %q", k)
	}
	args := strings.Join(c.qemuArgs(), " ")
	for _, want := range []string{"-nodefaults", "-no-user-config", "-M microvm,", "-accel kvm", "-cpu host", "-smp 2", "-m 356M",
		"readonly=on", "serial=sandboxd-base", "serial=sandboxd-layer", "virtserialport,chardev=agent,name=sandboxd", "-no-reboot",
		"-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny", "-S"} {
		if !strings.Contains(args, want) {
			t.Errorf("qemu args lack %q: %s", want, args)
		}
	}
	if strings.Contains(args, "-incoming") {
		t.Error("a cold boot waits for incoming state")
	}
	c.incoming = true
	if !strings.Contains(strings.Join(c.qemuArgs(), " "), "-incoming defer") {
		t.Error("a restore does not defer its incoming state")
	}
}

func TestCpio(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("needs cpio")
	}
	var b bytes.Buffer
	err := writeCpio(&b, []cpioEntry{
		{name: "dev", mode: 0o040755},
		{name: "dev/console", mode: 0o020600, major: 5, minor: 1},
		{name: "init", mode: 0o100755, data: []byte("#!/bin/sh\necho odd length\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if b.Len()%4 != 0 {
		t.Errorf("archive of %d bytes is not 4-aligned", b.Len())
	}
	cmd := exec.Command("cpio", "-itv")
	cmd.Stdin = &b
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -t: %v: %s", err, out)
	}
	s := string(out)
	for _, want := range []string{"drwxr-xr-x", "crw-------", "5,", "dev/console", "-rwxr-xr-x", "init"} {
		if !strings.Contains(s, want) {
			t.Errorf("listing lacks %q:\n%s", want, s)
		}
	}
}

func TestPrefix(t *testing.T) {
	p := &prefix{max: 5}
	for _, s := range []string{"ab", "cdef", "gh"} {
		if n, err := p.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("write %q: %d %v", s, n, err)
		}
	}
	if string(p.b) != "abcde" {
		t.Errorf("kept %q", p.b)
	}
}

// TestLayerStreamBound: the guest's layer stream is read up to the limit a
// disk of its size allows, never further, and a longer one is an error.
func TestLayerStreamBound(t *testing.T) {
	securitytest.Attack(t, "host disk", "a microVM guest streams a layer longer than its disk could hold",
		"the host stops reading at the limit and refuses the snapshot")
	const limit = 1 << 20
	var got bytes.Buffer
	n, err := io.Copy(&got, &boundedReader{r: io.LimitReader(zeroReader{}, 10<<20), left: limit})
	if !errors.Is(err, errStreamTooLong) || n != limit {
		t.Fatalf("a 10 MiB stream with a 1 MiB limit: %d bytes, %v", n, err)
	}
	if n, err := io.Copy(io.Discard, &boundedReader{r: io.LimitReader(zeroReader{}, limit), left: limit}); err != nil || n != limit {
		t.Fatalf("a stream of exactly the limit: %d bytes, %v", n, err)
	}
	if l := layerStreamLimit(64 << 20); l < 64<<20 || l > 128<<20 {
		t.Fatalf("limit for a 64 MiB disk: %d", l)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }
