package kernel

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
)

func TestCheckConfig(t *testing.T) {
	frag := []byte("# comment\nCONFIG_A=y\nCONFIG_B=n\nCONFIG_C=\"x\"\nCONFIG_D=64\n")
	cases := []struct {
		name   string
		config string
		want   []string
	}{
		{"all present", "CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=\"x\"\nCONFIG_D=64\n", nil},
		{"off by omission", "CONFIG_A=y\nCONFIG_C=\"x\"\nCONFIG_D=64\n", nil},
		{"dropped", "# CONFIG_A is not set\nCONFIG_C=\"x\"\nCONFIG_D=64\n", []string{"CONFIG_A=y (got n)"}},
		{"wrong value", "CONFIG_A=y\nCONFIG_B=y\nCONFIG_C=\"y\"\nCONFIG_D=32\n", []string{"CONFIG_B=n (got y)", "CONFIG_C=\"x\" (got \"y\")", "CONFIG_D=64 (got 32)"}},
		{"module is not built in", "CONFIG_A=m\nCONFIG_C=\"x\"\nCONFIG_D=64\n", []string{"CONFIG_A=y (got m)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckConfig(frag, []byte(tc.config))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// The fragment itself must parse and ask for what the microVM backend needs.
func TestFragment(t *testing.T) {
	cfg := parseConfig(Fragment)
	for _, k := range []string{"CONFIG_PVH", "CONFIG_VIRTIO_MMIO", "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES", "CONFIG_VIRTIO_BLK",
		"CONFIG_VIRTIO_CONSOLE", "CONFIG_EXT4_FS", "CONFIG_OVERLAY_FS", "CONFIG_CGROUPS", "CONFIG_MEMCG", "CONFIG_CGROUP_PIDS",
		"CONFIG_SECCOMP_FILTER", "CONFIG_BLK_DEV_INITRD", "CONFIG_UNIX98_PTYS", "CONFIG_PID_NS", "CONFIG_HW_RANDOM_VIRTIO"} {
		if cfg[k] != "y" {
			t.Errorf("fragment lacks %s=y", k)
		}
	}
	if _, ok := cfg["CONFIG_MODULES"]; ok && cfg["CONFIG_MODULES"] != "n" {
		t.Errorf("fragment enables modules")
	}
}

func TestKeyAndSource(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"linux-source-5.10.tar.xz", "linux-source-6.1.tar.xz", "linux-source-6.12.tar.xz", "other.tar.xz"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, err := findSource(filepath.Join(dir, "linux-source-6.1.tar.xz"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := findSource(filepath.Join(dir, "linux-source-6.12.tar.xz"))
	if err != nil {
		t.Fatal(err)
	}
	if a.version != "6.1" || b.version != "6.12" {
		t.Fatalf("versions %q %q", a.version, b.version)
	}
	ka, kb := key(a), key(b)
	if ka == kb {
		t.Fatal("different sources share a key")
	}
	if !strings.HasPrefix(id(a, ka), "6.1-sandboxd-") || len(id(a, ka)) != len("6.1-sandboxd-")+12 {
		t.Errorf("id %q", id(a, ka))
	}
	old := Fragment
	t.Cleanup(func() { Fragment = old })
	Fragment = append([]byte("CONFIG_EXTRA=y\n"), old...)
	if key(a) == ka {
		t.Error("a changed fragment keeps the key")
	}
	if _, err := findSource(filepath.Join(dir, "missing.tar.xz")); err == nil {
		t.Error("missing source accepted")
	}
}

// TestBuild builds the real kernel; it takes 10+ minutes on 2 cores, so it
// runs only with SANDBOXD_BUILD_KERNEL=1 (or when the kernel is cached in
// SANDBOXD_CACHE_DIR, where it just checks the cached one).
func TestBuild(t *testing.T) {
	cache := os.Getenv("SANDBOXD_CACHE_DIR")
	if cache == "" {
		cache = filepath.Join(t.TempDir(), "cache")
	}
	s := NewStore(cache, slog.Default())
	k, err := s.Lookup("")
	if err != nil && os.Getenv("SANDBOXD_BUILD_KERNEL") != "1" {
		t.Skipf("kernel not cached (%v); set SANDBOXD_BUILD_KERNEL=1 to build it", err)
	}
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
		defer cancel()
		if k, err = s.Build(ctx, BuildOptions{}, &progress.Lines{Logger: slog.Default()}); err != nil {
			t.Fatal(err)
		}
		t.Logf("built %s in %v: %d bytes", k.ID, k.BuildDuration.Round(time.Second), k.Size)
	}
	cfg, err := os.ReadFile(k.Config)
	if err != nil {
		t.Fatal(err)
	}
	if missing := CheckConfig(Fragment, cfg); len(missing) > 0 {
		t.Fatalf("cached kernel lacks %v", missing)
	}
	b, err := os.ReadFile(k.Path)
	if err != nil || len(b) < 4 || string(b[1:4]) != "ELF" {
		t.Fatalf("%s is not an ELF file (%v)", k.Path, err)
	}
	if !strings.HasSuffix(k.Release, LocalVersion) {
		t.Errorf("release %q", k.Release)
	}
	list, err := s.List()
	if err != nil || len(list) == 0 {
		t.Fatalf("list: %v %v", list, err)
	}
}
