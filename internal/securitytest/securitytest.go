// Package securitytest records the attacks that the test suite performs
// against sandboxd, so that the table of SECURITY.md is generated from what
// the tests really did instead of being typed by hand.
//
// A test that performs an attack calls Attack once it is set up; when the
// test ends, its record (area, attack, what containment was expected, and
// whether the test passed) is appended as one JSON line to the file named by
// $SANDBOXD_SECURITY_REPORT. Without that variable nothing is written, so the
// recorder costs nothing in ordinary runs. `make security` runs the suite
// with the variable set and renders the records into SECURITY.md with
// cmd/security-report.
package securitytest

import (
	"encoding/json"
	"os"
	"sync"
	"testing"
)

// EnvReport names the JSON-lines file that records are appended to.
const EnvReport = "SANDBOXD_SECURITY_REPORT"

// Record is one attack the suite performed.
type Record struct {
	Area      string `json:"area"`      // boundary under attack: "disk", "secrets", "keys", ...
	Attack    string `json:"attack"`    // what the test did, in one sentence
	Contained string `json:"contained"` // what the test asserts happens instead
	Test      string `json:"test"`      // the test's name
	Passed    bool   `json:"passed"`    // whether the test passed (the attack was contained)
	Skipped   bool   `json:"skipped,omitempty"`
}

// mu serialises appends from parallel tests of one process; O_APPEND keeps
// lines of several test processes whole.
var mu sync.Mutex

// Attack records that t performs attack against area and asserts contained.
// Call it before the assertions: the record is written when t ends, with
// t's outcome.
func Attack(t testing.TB, area, attack, contained string) {
	t.Helper()
	path := os.Getenv(EnvReport)
	if path == "" {
		return
	}
	t.Cleanup(func() {
		rec := Record{Area: area, Attack: attack, Contained: contained, Test: t.Name(), Passed: !t.Failed() && !t.Skipped(), Skipped: t.Skipped()}
		line, err := json.Marshal(rec)
		if err != nil {
			t.Errorf("securitytest: encode record: %v", err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Errorf("securitytest: open report: %v", err)
			return
		}
		defer f.Close()
		if _, err := f.Write(append(line, '\n')); err != nil {
			t.Errorf("securitytest: write report: %v", err)
		}
	})
}
