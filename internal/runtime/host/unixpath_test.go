package host

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDialUnixLongPath: a socket whose path is longer than a unix socket
// address holds is still reached.
func TestDialUnixLongPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "x.sock")
	// Listen through the same trick (bind has the same limit).
	name, release, err := UnixPath(path)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", name)
	release()
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	if len(path) < maxSunPath {
		t.Fatalf("the test path is short (%d)", len(path))
	}
	var d net.Dialer
	if _, err := d.DialContext(context.Background(), "unix", path); err == nil {
		t.Fatal("the long path dialled directly: the test proves nothing")
	}
	c, err := DialUnix(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := make([]byte, 2)
	if _, err := c.Read(b); err != nil || string(b) != "hi" {
		t.Fatalf("read %q %v", b, err)
	}
}
