package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strings"

	"github.com/invopop/jsonschema"
	orderedmap "github.com/pb33f/ordered-map/v2"

	"github.com/sandboxd/sandboxd/internal/netpol"
)

// route is one operation of the API: how it is served and how it is
// documented. The OpenAPI document is generated from the routes table, so a
// route cannot exist without its documentation or the other way round.
type route struct {
	method      string
	path        string // chi pattern; {id} parameters are documented as path parameters
	summary     string
	description string
	tag         string
	public      bool // no API key needed
	query       any  // struct whose json fields are the query parameters
	body        any  // request body type
	ok          any  // 200 body type
	okNullable  bool // the 200 body may be JSON null instead
	stream      bool // may answer text/event-stream
	anyMethod   bool // served for every method, documented as method
	// websocket: the route upgrades to a websocket of the API's own
	// (documented with 101 and 426); its key may come as a
	// sandboxd.key.<KEY> subprotocol (requestKey).
	websocket bool
	// acts: the route changes state or starts work although its method is
	// GET, so a sandbox's key (which only reads) may not call it.
	acts    bool
	handler handler
}

// handler serves a route; the error it returns is written once, by the
// router (writeError), as the contract's body for its class.
type handler func(w http.ResponseWriter, r *http.Request) error

// errorResponses are documented on every authenticated route.
var errorResponses = map[string]string{
	"400": "Invalid request: the first failing field and the reason",
	"401": "Missing, duplicated, unknown, expired or revoked API key",
	"403": "The key may not act for account_id",
	"404": "Not found, or not the caller's",
	"429": "Over a quota",
	"500": "Internal error (no details)",
}

// openAPIDocument builds the OpenAPI 3.1 document of routes.
func openAPIDocument(routes []route, version string) ([]byte, error) {
	schemas := map[string]any{}
	reflector := &jsonschema.Reflector{
		Anonymous:                 true,
		AllowAdditionalProperties: true,
		Mapper: func(t reflect.Type) *jsonschema.Schema {
			switch t {
			case reflect.TypeFor[json.RawMessage]():
				return &jsonschema.Schema{Type: "object"}
			case reflect.TypeFor[netpol.Policy]():
				return &jsonschema.Schema{
					Description: `Network policy (sandboxd): "none" (default), "egress", or {"allow": [IPv4 CIDR, address, domain or *.domain, ...]}. A server-wide deny list (host, other sandboxes, metadata, private ranges) always wins.`,
					OneOf: []*jsonschema.Schema{
						{Type: "string", Enum: []any{"none", "egress"}},
						{Type: "object", Required: []string{"allow"}, Properties: allowProps()},
					},
				}
			}
			return nil
		},
	}
	// ref reflects v into components and returns a $ref to it.
	ref := func(v any) (map[string]any, error) {
		s := reflector.Reflect(v)
		raw, err := json.Marshal(s)
		if err != nil {
			return nil, fmt.Errorf("marshal schema of %T: %w", v, err)
		}
		raw = []byte(strings.ReplaceAll(string(raw), "#/$defs/", "#/components/schemas/"))
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("decode schema of %T: %w", v, err)
		}
		if defs, ok := m["$defs"].(map[string]any); ok {
			for name, d := range defs {
				schemas[name] = d
			}
		}
		delete(m, "$defs")
		delete(m, "$schema")
		return m, nil
	}
	errRef, err := ref(ErrorBody{})
	if err != nil {
		return nil, err
	}

	paths := map[string]map[string]any{}
	for _, rt := range routes {
		op := map[string]any{
			"summary":     rt.summary,
			"operationId": operationID(rt),
			"tags":        []string{rt.tag},
		}
		if rt.description != "" {
			op["description"] = rt.description
		}
		var params []any
		for _, name := range pathParams(rt.path) {
			params = append(params, map[string]any{"name": name, "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
		}
		if rt.query != nil {
			qs, err := ref(rt.query)
			if err != nil {
				return nil, err
			}
			qs = resolve(qs, schemas)
			required := map[string]bool{}
			if req, ok := qs["required"].([]any); ok {
				for _, r := range req {
					required[r.(string)] = true
				}
			}
			props, _ := qs["properties"].(map[string]any)
			for _, name := range sortedKeys(props) {
				params = append(params, map[string]any{"name": name, "in": "query", "required": required[name], "schema": props[name]})
			}
		}
		if len(params) > 0 {
			op["parameters"] = params
		}
		if rt.body != nil {
			bs, err := ref(rt.body)
			if err != nil {
				return nil, err
			}
			op["requestBody"] = map[string]any{
				"required": false,
				"content":  map[string]any{"application/json": map[string]any{"schema": bs}},
			}
		}
		responses := map[string]any{}
		if rt.ok != nil {
			okSchema, err := ref(rt.ok)
			if err != nil {
				return nil, err
			}
			if rt.okNullable {
				okSchema = map[string]any{"anyOf": []any{okSchema, map[string]any{"type": "null"}}}
			}
			content := map[string]any{"application/json": map[string]any{"schema": okSchema}}
			if rt.stream {
				content["text/event-stream"] = map[string]any{"schema": map[string]any{"type": "string", "description": "Server-Sent Events: stdout, stderr, exit"}}
			}
			responses["200"] = map[string]any{"description": "Success", "content": content}
		}
		if rt.websocket {
			responses["101"] = map[string]any{"description": "Switching Protocols: the websocket"}
			responses["426"] = map[string]any{"description": "Not a websocket upgrade", "content": map[string]any{"application/json": map[string]any{"schema": errRef}}}
		}
		for code, desc := range errorResponses {
			if rt.public && code != "500" {
				continue
			}
			responses[code] = map[string]any{"description": desc, "content": map[string]any{"application/json": map[string]any{"schema": errRef}}}
		}
		op["responses"] = responses
		if rt.public {
			op["security"] = []any{}
		}
		p := rt.path
		if paths[p] == nil {
			paths[p] = map[string]any{}
		}
		paths[p][strings.ToLower(rt.method)] = op
	}
	doc := map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{
			"title":       "sandboxd API",
			"version":     version,
			"description": "Ephemeral, isolated Linux sandboxes for AI agents and applications.",
		},
		"paths": paths,
		"components": map[string]any{
			"schemas": schemas,
			"securitySchemes": map[string]any{
				"apiKey": map[string]any{"type": "apiKey", "in": "header", "name": "x-api-key"},
				"bearer": map[string]any{"type": "http", "scheme": "bearer"},
			},
		},
		"security": []any{map[string]any{"apiKey": []any{}}, map[string]any{"bearer": []any{}}},
	}
	return json.MarshalIndent(doc, "", "  ")
}

func allowProps() *orderedmap.OrderedMap[string, *jsonschema.Schema] {
	props := orderedmap.New[string, *jsonschema.Schema]()
	props.Set("allow", &jsonschema.Schema{Type: "array", MaxItems: ptr(uint64(netpol.MaxAllow)), Items: &jsonschema.Schema{Type: "string"}})
	return props
}

func ptr[T any](v T) *T { return &v }

// resolve follows a top-level $ref into the collected schemas.
func resolve(s map[string]any, schemas map[string]any) map[string]any {
	if r, ok := s["$ref"].(string); ok {
		if d, ok := schemas[strings.TrimPrefix(r, "#/components/schemas/")].(map[string]any); ok {
			return d
		}
	}
	return s
}

func pathParams(p string) []string {
	var out []string
	for _, seg := range strings.Split(p, "/") {
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
			out = append(out, strings.Trim(seg, "{}"))
		}
	}
	return out
}

func operationID(rt route) string {
	var b strings.Builder
	b.WriteString(strings.ToLower(rt.method))
	for _, seg := range strings.Split(rt.path, "/") {
		seg = strings.Trim(seg, "{}.")
		if seg == "" || seg == "api" {
			continue
		}
		b.WriteString(strings.ToUpper(seg[:1]) + strings.ReplaceAll(seg[1:], "-", ""))
	}
	return b.String()
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
