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

	"github.com/sandboxd/sandboxd/internal/contract"
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
	accepted    bool // ok is answered with 202 Accepted (work goes on)
	// conflict, when set, documents the route's 409 (what it refuses).
	conflict   string
	okNullable bool // the 200 body may be JSON null instead
	stream     bool // may answer text/event-stream
	// eventsOnly: the route answers only text/event-stream; ok is the
	// data of its last event.
	eventsOnly bool
	anyMethod  bool // served for every method, documented as method
	// websocket: the route upgrades to a websocket of the API's own
	// (documented with 101 and 426); its key may come as a
	// sandboxd.key.<KEY> subprotocol (requestKey).
	websocket bool
	// acts, when set, says why a sandbox's key (which only reads) may not
	// call the route although its method is GET: it changes state, starts
	// work, or reaches into a running sandbox.
	acts string
	// paged: the route's 200 may carry the next page's cursor
	// (contract.NextCursorHeader).
	paged bool
	// rawBody and rawOK are the media types of a request body and a 200
	// that are bytes of their own (an archive) rather than JSON.
	rawBody, rawOK string
	handler        handler
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
				// One component for the three places a policy
				// appears, so that generated clients have one type
				// for it.
				return &jsonschema.Schema{Ref: "#/$defs/" + networkPolicySchema}
			}
			return nil
		},
	}
	// ref reflects v into components and returns a $ref to it.
	ref := func(v any) (map[string]any, error) {
		m, err := schemaMap(reflector.Reflect(v))
		if err != nil {
			return nil, fmt.Errorf("schema of %T: %w", v, err)
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
	errRef, err := ref(contract.ErrorBody{})
	if err != nil {
		return nil, err
	}
	policy, err := schemaMap(networkPolicy())
	if err != nil {
		return nil, fmt.Errorf("schema of the network policy: %w", err)
	}
	schemas[networkPolicySchema] = policy

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
				schema := props[name]
				if m, ok := schema.(map[string]any); ok {
					// A parameter is not a field: its order means nothing.
					delete(m, xOrder)
				}
				params = append(params, map[string]any{"name": name, "in": "query", "required": required[name], "schema": schema})
			}
		}
		if len(params) > 0 {
			op["parameters"] = params
		}
		if rt.rawBody != "" {
			op["requestBody"] = map[string]any{
				"required": true,
				"content":  map[string]any{rt.rawBody: map[string]any{"schema": map[string]any{"type": "string", "format": "binary"}}},
			}
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
			switch {
			case rt.eventsOnly:
				content = map[string]any{"text/event-stream": map[string]any{"schema": map[string]any{"type": "string", "description": "Server-Sent Events (see the description); the last event's data is this", "contentSchema": okSchema}}}
			case rt.stream:
				content["text/event-stream"] = map[string]any{"schema": map[string]any{"type": "string", "description": "Server-Sent Events: stdout, stderr, exit"}}
			}
			ok := map[string]any{"description": "Success", "content": content}
			if rt.paged {
				ok["headers"] = map[string]any{contract.NextCursorHeader: map[string]any{
					"description": "The cursor of the next page; absent on the last page",
					"schema":      map[string]any{"type": "string"},
				}}
			}
			if rt.accepted {
				ok["description"] = "Accepted: the work goes on in the background"
				responses["202"] = ok
			} else {
				responses["200"] = ok
			}
		}
		if rt.conflict != "" {
			responses["409"] = map[string]any{"description": rt.conflict, "content": map[string]any{"application/json": map[string]any{"schema": errRef}}}
		}
		if rt.rawOK != "" {
			responses["200"] = map[string]any{"description": "Success", "content": map[string]any{rt.rawOK: map[string]any{"schema": map[string]any{"type": "string", "format": "binary"}}}}
		}
		if rt.websocket {
			responses["101"] = map[string]any{"description": "Switching Protocols: the websocket"}
			responses["426"] = map[string]any{"description": "Not a websocket upgrade", "content": map[string]any{"application/json": map[string]any{"schema": errRef}}}
		}
		if rt.body != nil || rt.rawBody != "" {
			responses["408"] = map[string]any{"description": "The request body stalled or trickled past its deadline", "content": map[string]any{"application/json": map[string]any{"schema": errRef}}}
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

// schemaMap renders s as the document holds it: with x-order, its
// references into the document's components and no boolean schemas.
func schemaMap(s *jsonschema.Schema) (map[string]any, error) {
	orderProperties(s)
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	raw = []byte(strings.ReplaceAll(string(raw), "#/$defs/", "#/components/schemas/"))
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	trueToEmpty(m)
	return m, nil
}

// networkPolicySchema names the component of netpol.Policy.
const networkPolicySchema = "NetworkPolicy"

// networkPolicy is the schema of netpol.Policy, which is JSON of its own
// (a string or an object) rather than a struct to reflect.
func networkPolicy() *jsonschema.Schema {
	return &jsonschema.Schema{
		Description: `Network policy (sandboxd): "none" (default), "egress", or {"allow": [IPv4 CIDR, address, domain or *.domain, ...]}. A server-wide deny list (host, other sandboxes, metadata, private ranges) always wins.`,
		OneOf: []*jsonschema.Schema{
			{Type: "string", Enum: []any{"none", "egress"}},
			{Type: "object", Required: []string{"allow"}, Properties: allowProps()},
		},
	}
}

// xOrder is the extension that carries a property's place among its
// object's fields: the document's objects are JSON maps (keys sorted),
// and generators that honour it (oapi-codegen) then declare the fields in
// the order of the Go types, which is the order the server writes them in.
const xOrder = "x-order"

// orderProperties sets x-order on the properties of every object schema
// in s, in their declared order.
func orderProperties(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if s.Properties != nil {
		i := 0
		for pair := s.Properties.Oldest(); pair != nil; pair = pair.Next() {
			if pair.Value.Extras == nil {
				pair.Value.Extras = map[string]any{}
			}
			pair.Value.Extras[xOrder] = i
			i++
			hoistNullableDescription(pair.Value)
			orderProperties(pair.Value)
		}
	}
	for _, d := range s.Definitions {
		orderProperties(d)
	}
	orderProperties(s.Items)
	orderProperties(s.AdditionalProperties)
	for _, list := range [][]*jsonschema.Schema{s.OneOf, s.AnyOf, s.AllOf} {
		for _, sub := range list {
			orderProperties(sub)
		}
	}
}

// hoistNullableDescription moves the description of a nullable field
// (the reflector's oneOf [schema, null]) from its schema to the field,
// where readers and generators look for it.
func hoistNullableDescription(s *jsonschema.Schema) {
	if len(s.OneOf) != 2 || s.OneOf[1].Type != "null" || s.Description != "" {
		return
	}
	s.Description, s.OneOf[0].Description = s.OneOf[0].Description, ""
}

// trueToEmpty replaces the boolean schema true (anything, e.g. the items
// of a []any) by its equivalent {}: OpenAPI 3.0 tools, whose parsers many
// generators still use, accept only objects as schemas.
func trueToEmpty(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, sub := range v {
			if b, ok := sub.(bool); ok && b && (k == "items" || k == "additionalProperties") {
				v[k] = map[string]any{}
				continue
			}
			trueToEmpty(sub)
		}
	case []any:
		for _, sub := range v {
			trueToEmpty(sub)
		}
	}
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
