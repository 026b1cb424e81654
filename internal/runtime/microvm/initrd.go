package microvm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
)

// cpioEntry is one file of an initramfs.
type cpioEntry struct {
	name         string
	mode         uint32 // type and permission bits, as in st_mode
	major, minor uint32 // device nodes
	data         []byte
}

// writeCpio writes entries as a "newc" cpio archive, the format the kernel
// unpacks into its initial root file system. Owners are root; mtimes zero,
// so the archive depends only on its content.
func writeCpio(w io.Writer, entries []cpioEntry) error {
	var ino uint32 = 1
	write := func(e cpioEntry) error {
		name := append([]byte(e.name), 0)
		nlink := uint32(1)
		if e.mode&0o170000 == 0o040000 {
			nlink = 2
		}
		hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
			ino, e.mode, 0, 0, nlink, 0, len(e.data), 0, 0, e.major, e.minor, len(name), 0)
		ino++
		var b bytes.Buffer
		b.WriteString(hdr)
		b.Write(name)
		for b.Len()%4 != 0 {
			b.WriteByte(0)
		}
		b.Write(e.data)
		for b.Len()%4 != 0 {
			b.WriteByte(0)
		}
		_, err := w.Write(b.Bytes())
		return err
	}
	for _, e := range entries {
		if err := write(e); err != nil {
			return err
		}
	}
	return write(cpioEntry{name: "TRAILER!!!"})
}

// buildInitrd writes the initramfs of every microVM into dir: the agent as
// /sandbox-agent, /dev/console for its output, and the mount points it
// uses before the root file system exists. It is named after its content,
// so a new agent binary gets a new initramfs and running VMs keep theirs.
func buildInitrd(agentPath, dir string) (string, error) {
	agent, err := os.ReadFile(agentPath)
	if err != nil {
		return "", fmt.Errorf("read agent: %w", err)
	}
	var b bytes.Buffer
	entries := []cpioEntry{
		{name: "dev", mode: 0o040755},
		{name: "dev/console", mode: 0o020600, major: 5, minor: 1},
		{name: "proc", mode: 0o040755},
		{name: "sys", mode: 0o040755},
		{name: "sandbox-agent", mode: 0o100755, data: agent},
	}
	if err := writeCpio(&b, entries); err != nil {
		return "", err
	}
	sum := sha256.Sum256(b.Bytes())
	path := filepath.Join(dir, "initrd-"+hex.EncodeToString(sum[:6])+".cpio")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := renameio.WriteFile(path, b.Bytes(), 0o444); err != nil {
		return "", fmt.Errorf("write initrd: %w", err)
	}
	return path, nil
}
