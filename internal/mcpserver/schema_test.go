package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// argumentCases are testdata/arguments.json: for each tool, argument
// objects the tool documents and takes (valid) and ones it refuses
// (invalid). e2e/mcp_schema_test.go checks the same cases with ajv.
type argumentCases map[string]struct {
	Valid   []json.RawMessage `json:"valid"`
	Invalid []json.RawMessage `json:"invalid"`
}

func loadArgumentCases(t *testing.T) argumentCases {
	t.Helper()
	data, err := os.ReadFile("testdata/arguments.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases argumentCases
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatalf("testdata/arguments.json: %v", err)
	}
	return cases
}

// TestInputSchemasValidate: each tool's inputSchema, as tools/list gives it
// to clients, compiles with a standard JSON Schema validator (drafts 7
// and 2020-12, the ones clients use), accepts the documented arguments and
// refuses the invalid ones; and the tool itself refuses those too, so the
// schema never refuses what the tool would take in its place.
func TestInputSchemasValidate(t *testing.T) {
	f := newFixture(t)
	cs := f.connect(t, "alice")
	cases := loadArgumentCases(t)
	var listed []string
	for tool, err := range cs.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, tool.Name)
		raw, err := json.Marshal(tool.InputSchema)
		if err != nil {
			t.Fatal(err)
		}
		tc, ok := cases[tool.Name]
		if !ok || len(tc.Valid) == 0 || len(tc.Invalid) == 0 {
			t.Errorf("%s: no valid and invalid arguments in testdata/arguments.json", tool.Name)
			continue
		}
		for _, draft := range []*jsonschema.Draft{jsonschema.Draft7, jsonschema.Draft2020} {
			sch := compileSchema(t, tool.Name, draft, raw)
			for _, args := range tc.Valid {
				if err := sch.Validate(instance(t, args)); err != nil {
					t.Errorf("%s (%v) refuses documented arguments %s: %v\nschema: %s", tool.Name, draft, args, err, raw)
				}
			}
			for _, args := range tc.Invalid {
				if sch.Validate(instance(t, args)) == nil {
					t.Errorf("%s (%v) accepts invalid arguments %s\nschema: %s", tool.Name, draft, args, raw)
				}
			}
		}
		for _, args := range tc.Invalid {
			if text, isErr := callTool(t, cs, tool.Name, decodeArgs(t, args)); !isErr {
				t.Errorf("%s takes arguments its schema refuses: %s: %s", tool.Name, args, text)
			}
		}
	}
	for name := range cases {
		if !slices.Contains(listed, name) {
			t.Errorf("testdata/arguments.json has cases for %s, which is not a tool", name)
		}
	}
}

func compileSchema(t *testing.T, name string, draft *jsonschema.Draft, raw []byte) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(draft)
	url := "urn:sandboxd:" + name
	if err := c.AddResource(url, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		t.Fatalf("%s's inputSchema does not compile (%v): %v\n%s", name, draft, err, raw)
	}
	return sch
}

func instance(t *testing.T, raw json.RawMessage) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func decodeArgs(t *testing.T, raw json.RawMessage) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}
