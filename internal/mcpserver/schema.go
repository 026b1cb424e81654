package mcpserver

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/volumes"
)

// The input schemas are what clients validate arguments against before
// they call, often with a strict validator (ajv): each must accept every
// argument object the tools document and take, and should refuse what the
// handlers refuse whatever the account. The handlers still check every
// argument themselves (contract.Args), so that a bad value gets the API's
// message rather than a validator's; the schemas only describe.

// inputSchema is the input schema of a tool whose arguments are the
// struct type in.
func inputSchema(in reflect.Type) (*jsonschema.Schema, error) {
	s, err := jsonschema.ForType(in, &jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
		reflect.TypeFor[netpol.Policy](): networkSchema(),
	}})
	if err != nil {
		return nil, err
	}
	for name, prop := range s.Properties {
		if rule, ok := argRules[name]; ok {
			rule(prop)
		}
		if !slices.Contains(s.Required, name) {
			nullable(prop)
		}
	}
	return s, nil
}

// networkSchema is the network policy of a new sandbox as the API takes it
// (netpol.Policy's JSON form), or null for the server's default. It has no
// type of its own: one beside the oneOf, as the schema library adds for a
// pointer, would have to hold for every branch too.
func networkSchema() *jsonschema.Schema {
	return &jsonschema.Schema{
		Description: `Network of the new sandbox: "none" (loopback only), "egress" (the internet, never the host or private ranges), or {"allow": ["CIDR, address, domain or *.domain", ...]}. Default (absent or null): the server's.`,
		OneOf: []*jsonschema.Schema{
			{Type: "string", Enum: []any{string(netpol.ModeNone), string(netpol.ModeEgress)}},
			{
				Type: "object",
				Properties: map[string]*jsonschema.Schema{"allow": {
					Type: "array", Items: &jsonschema.Schema{Type: "string", MinLength: jsonschema.Ptr(1)},
					MinItems: jsonschema.Ptr(1), MaxItems: jsonschema.Ptr(netpol.MaxAllow),
				}},
				Required:             []string{"allow"},
				AdditionalProperties: &jsonschema.Schema{Not: &jsonschema.Schema{}},
			},
			{Type: "null"},
		},
	}
}

// argRules add to an argument's schema what its Go type cannot say: the
// bounds the handlers check, by argument name (a name means the same in
// every tool that takes it).
var argRules = map[string]func(*jsonschema.Schema){
	// Present, these must name something: "" is refused as missing.
	"prompt":     minLength(1),
	"command":    minLength(1),
	"sandbox_id": minLength(1),
	"run_id":     minLength(1),
	"template":   minLength(1),
	"snapshot":   minLength(1),
	"name":       minLength(1),
	"new_name":   minLength(1),
	// Milliseconds: a positive number of them.
	"timeout": func(s *jsonschema.Schema) { s.Minimum = jsonschema.Ptr(1.0) },
	"limit": func(s *jsonschema.Schema) {
		s.Minimum, s.Maximum = jsonschema.Ptr(1.0), jsonschema.Ptr(float64(maxRunsListed))
	},
	"encoding": func(s *jsonschema.Schema) { s.Enum = []any{"utf-8", "base64"} },
	"log_lines": func(s *jsonschema.Schema) {
		s.Minimum, s.Maximum = jsonschema.Ptr(1.0), jsonschema.Ptr(float64(maxLogLines))
	},
	// Optional, so null (absent) is one of its values too.
	"status": func(s *jsonschema.Schema) { s.Enum = []any{nil, "building", "ready", "failed"} },
	// build_template's steps: E2B's TemplateStep objects, of the types a
	// build runs, each with its arguments.
	"steps": func(s *jsonschema.Schema) {
		s.Type, s.Types = "array", nil
		item := s.Items
		item.Properties["type"].Enum = templateStepKinds
		args := item.Properties["args"]
		args.Type, args.Types = "array", nil
	},
	// A volume's size in MiB: at least the smallest volume (the largest
	// is the server's to say).
	"size_mb": func(s *jsonschema.Schema) { s.Minimum = jsonschema.Ptr(float64(volumes.MinSize / volumes.MiB)) },
	// A new sandbox's volumes, as POST /api/sandboxes takes them: a few,
	// each naming one and saying where it goes, an absolute path other
	// than /.
	"volumes": func(s *jsonschema.Schema) {
		s.MaxItems = jsonschema.Ptr(contract.MaxCreateVolumes)
		item := s.Items
		item.Properties["name"].MinLength = jsonschema.Ptr(1)
		path := item.Properties["path"]
		path.MinLength, path.Pattern = jsonschema.Ptr(2), "^/"
	},
	// As POST /api/sandboxes/files: 1 to 100 files, never null.
	"files": func(s *jsonschema.Schema) {
		s.Type, s.Types = "array", nil
		s.MinItems, s.MaxItems = jsonschema.Ptr(1), jsonschema.Ptr(maxUploadFiles)
	},
}

// maxUploadFiles is what one upload_files call takes, as the API.
const maxUploadFiles = 100

func minLength(n int) func(*jsonschema.Schema) {
	return func(s *jsonschema.Schema) { s.MinLength = jsonschema.Ptr(n) }
}

// nullable lets an optional argument be null: the handlers take null as
// absent, for clients that send every optional field, unset ones as null.
// A schema without a type (network) says so itself.
func nullable(s *jsonschema.Schema) {
	switch {
	case s.Type != "":
		s.Types, s.Type = []string{"null", s.Type}, ""
	case len(s.Types) > 0 && !slices.Contains(s.Types, "null"):
		s.Types = append([]string{"null"}, s.Types...)
	}
}

// mustInputSchema is inputSchema for the package's own argument types, whose
// failure is a programming error that every test catches.
func mustInputSchema(name string, in reflect.Type) *jsonschema.Schema {
	s, err := inputSchema(in)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: schema of %s: %v", name, err))
	}
	return s
}
