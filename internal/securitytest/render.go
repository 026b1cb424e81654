package securitytest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Read parses the JSON lines that Attack appended.
func Read(r io.Reader) ([]Record, error) {
	var recs []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var rec Record
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			return nil, fmt.Errorf("report line %d: %w", n, err)
		}
		recs = append(recs, rec)
	}
	return recs, sc.Err()
}

// Table renders records as a Markdown table, sorted by area then test, one
// row per distinct (area, attack, test); a test run twice (two database
// dialects, say) passes only if every run passed.
func Table(recs []Record) string {
	type key struct{ area, attack, test string }
	merged := map[key]Record{}
	var order []key
	for _, r := range recs {
		k := key{r.Area, r.Attack, r.Test}
		prev, seen := merged[k]
		if !seen {
			order = append(order, k)
			merged[k] = r
			continue
		}
		prev.Passed = prev.Passed && r.Passed
		prev.Skipped = prev.Skipped && r.Skipped
		merged[k] = prev
	}
	sort.Slice(order, func(i, j int) bool {
		if order[i].area != order[j].area {
			return order[i].area < order[j].area
		}
		return order[i].test < order[j].test
	})
	var b strings.Builder
	b.WriteString("| area | attack | contained when | test | result |\n|---|---|---|---|---|\n")
	for _, k := range order {
		r := merged[k]
		result := "contained"
		switch {
		case r.Skipped:
			result = "skipped"
		case !r.Passed:
			result = "**NOT CONTAINED**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | `%s` | %s |\n", cell(r.Area), cell(r.Attack), cell(r.Contained), r.Test, result)
	}
	return b.String()
}

func cell(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ") }
