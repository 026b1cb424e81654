// Command security-report renders the attack records that the test suite
// appended to a JSON-lines file (see internal/securitytest) into the table
// of SECURITY.md, between the markers
//
//	<!-- attacks:begin --> and <!-- attacks:end -->.
//
// Usage: security-report -records FILE -doc SECURITY.md
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

const (
	beginMarker = "<!-- attacks:begin -->"
	endMarker   = "<!-- attacks:end -->"
)

func main() {
	records := flag.String("records", "", "JSON-lines file written by the test suite")
	doc := flag.String("doc", "SECURITY.md", "Markdown document whose attack table is replaced")
	flag.Parse()
	if err := run(*records, *doc); err != nil {
		fmt.Fprintln(os.Stderr, "security-report:", err)
		os.Exit(1)
	}
}

func run(records, doc string) error {
	raw, err := os.ReadFile(records)
	if err != nil {
		return fmt.Errorf("read records: %w", err)
	}
	recs, err := securitytest.Read(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	if len(recs) == 0 {
		return fmt.Errorf("%s holds no records: did the suite run with %s set?", records, securitytest.EnvReport)
	}
	text, err := os.ReadFile(doc)
	if err != nil {
		return fmt.Errorf("read %s: %w", doc, err)
	}
	s := string(text)
	i, j := strings.Index(s, beginMarker), strings.Index(s, endMarker)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s … %s section", doc, beginMarker, endMarker)
	}
	out := s[:i+len(beginMarker)] + "\n" + securitytest.Table(recs) + s[j:]
	if err := os.WriteFile(doc, []byte(out), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", doc, err)
	}
	fmt.Printf("security-report: %d records into %s\n", len(recs), doc)
	return nil
}
