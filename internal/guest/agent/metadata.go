package agent

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// A file's user-defined metadata (envd 0.6.2; E2B's files.write({metadata})):
// key/value pairs kept as extended attributes of the file under
// metadataPrefix, set by an upload's X-Metadata-<key> headers (keys lower-
// cased) and answered in the file's EntryInfo. An upload replaces the
// file's whole set (a key it does not give goes). A file system without
// extended attributes keeps none, and answers none: the write itself
// stands. Everything here is done as the user the request acts as, so that
// a user never reads or sets the metadata of a file it may not.

// Bounds of one file's metadata: the kernel's 255 bytes of an attribute's
// name, and what ext4 keeps in one block of an inode.
const (
	metadataPrefix      = "user.e2b."
	metadataHeader      = "X-Metadata-"
	maxMetadataKeyLen   = 255 - len(metadataPrefix)
	maxMetadataTotalLen = 4096
)

// uploadMetadata is the metadata an upload's headers give (nil: none);
// keys and values must be printable US-ASCII, within the bounds.
func uploadMetadata(h http.Header) (map[string]string, error) {
	var md map[string]string
	total := 0
	for name, values := range h {
		key, ok := strings.CutPrefix(http.CanonicalHeaderKey(name), http.CanonicalHeaderKey(metadataHeader))
		if !ok || len(values) == 0 || key == "" {
			continue
		}
		key = strings.ToLower(key)
		if len(key) > maxMetadataKeyLen {
			return nil, badRequest("metadata key %q is longer than %d bytes", key, maxMetadataKeyLen)
		}
		if !printableASCII(key) || !printableASCII(values[0]) {
			return nil, badRequest("metadata %q: keys and values are printable US-ASCII", key)
		}
		total += len(metadataPrefix) + len(key) + len(values[0])
		if md == nil {
			md = map[string]string{}
		}
		md[key] = values[0]
	}
	if total > maxMetadataTotalLen {
		return nil, badRequest("metadata of %d bytes: at most %d", total, maxMetadataTotalLen)
	}
	return md, nil
}

func printableASCII(s string) bool {
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// xattrUnsupported reports whether err says the file system keeps no
// extended attributes.
func xattrUnsupported(err error) bool {
	return errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP)
}

// writeMetadata replaces open file f's metadata with md (nil clears it).
// Call it as the user.
func writeMetadata(f *os.File, md map[string]string) error {
	fd := int(f.Fd())
	names, err := listXattrs(func(buf []byte) (int, error) { return unix.Flistxattr(fd, buf) })
	if err != nil {
		return err
	}
	for _, name := range names {
		key, ok := strings.CutPrefix(name, metadataPrefix)
		if _, keep := md[key]; !ok || keep {
			continue
		}
		if err := unix.Fremovexattr(fd, name); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("remove metadata %q: %w", key, err)
		}
	}
	for k, v := range md {
		if err := unix.Fsetxattr(fd, metadataPrefix+k, []byte(v), 0); err != nil {
			return fmt.Errorf("set metadata %q: %w", k, err)
		}
	}
	return nil
}

// readMetadata is path's metadata (following a final symbolic link, as
// envd's does), nil when it has none, or when it cannot be read (no
// extended attributes; not the user's to read). Call it as the user.
func readMetadata(path string) map[string]string {
	names, err := listXattrs(func(buf []byte) (int, error) { return unix.Listxattr(path, buf) })
	if err != nil {
		return nil
	}
	var md map[string]string
	for _, name := range names {
		key, ok := strings.CutPrefix(name, metadataPrefix)
		if !ok {
			continue
		}
		buf := make([]byte, 4096)
		n, err := unix.Getxattr(path, name, buf)
		if err != nil {
			continue
		}
		// Set from inside the sandbox (setfattr), a value may be any
		// bytes: the answer's map holds UTF-8 only.
		if !utf8.ValidString(key) || !utf8.Valid(buf[:n]) {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(buf[:n])
	}
	return md
}

// listXattrs lists attribute names with list (a listxattr call), growing
// its buffer when the list grew meanwhile.
func listXattrs(list func([]byte) (int, error)) ([]string, error) {
	for range 4 {
		n, err := list(nil)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, nil
		}
		buf := make([]byte, n)
		n, err = list(buf)
		if errors.Is(err, syscall.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				names = append(names, s)
			}
		}
		return names, nil
	}
	return nil, syscall.ERANGE
}
