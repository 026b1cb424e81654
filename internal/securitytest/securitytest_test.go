package securitytest

import (
	"strings"
	"testing"
)

func TestTableMergesRunsAndMarksFailures(t *testing.T) {
	recs := []Record{
		{Area: "disk", Attack: "fill the log", Contained: "log capped", Test: "TestLog", Passed: true},
		{Area: "disk", Attack: "fill the log", Contained: "log capped", Test: "TestLog", Passed: false},
		{Area: "api", Attack: "two keys", Contained: "401", Test: "TestKeys", Passed: true},
		{Area: "net", Attack: "spoof", Contained: "dropped", Test: "TestSpoof", Skipped: true},
	}
	got := Table(recs)
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 5 {
		t.Fatalf("want header, rule and 3 rows, got:\n%s", got)
	}
	if !strings.Contains(lines[2], "TestKeys") || !strings.Contains(lines[2], "| contained |") {
		t.Errorf("api row first and contained: %q", lines[2])
	}
	if !strings.Contains(lines[3], "NOT CONTAINED") {
		t.Errorf("a test that failed once is not contained: %q", lines[3])
	}
	if !strings.Contains(lines[4], "skipped") {
		t.Errorf("skipped row: %q", lines[4])
	}
}

func TestReadRoundTrip(t *testing.T) {
	recs, err := Read(strings.NewReader(`{"area":"a","attack":"b","contained":"c","test":"T","passed":true}` + "\n\n"))
	if err != nil || len(recs) != 1 || !recs[0].Passed || recs[0].Area != "a" {
		t.Fatalf("Read = %+v, %v", recs, err)
	}
	if _, err := Read(strings.NewReader("{not json\n")); err == nil {
		t.Fatal("Read accepted a broken line")
	}
}
