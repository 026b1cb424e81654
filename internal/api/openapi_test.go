package api

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/netpol"
)

// TestOpenAPINullablePointers: a pointer field without omitempty is sent
// as null when unset, so the document must say it may be (a jsonschema
// "nullable" tag); otherwise typed clients generated from it declare a
// plain string or object there and choke on, or hide, the null.
func TestOpenAPINullablePointers(t *testing.T) {
	seen := map[reflect.Type]bool{}
	var walk func(t reflect.Type)
	walk = func(typ reflect.Type) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Map {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || seen[typ] || typ == reflect.TypeFor[netpol.Policy]() {
			return
		}
		seen[typ] = true
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if f.Type.Kind() == reflect.Pointer && !slices.Contains(strings.Split(opts, ","), "omitempty") &&
				!slices.Contains(strings.Split(f.Tag.Get("jsonschema"), ","), "nullable") {
				t.Errorf("%s.%s (%s) can be null but its jsonschema tag does not say nullable", typ.Name(), f.Name, name)
			}
			walk(f.Type)
		}
	}
	for _, rt := range (&Server{}).routeTable() {
		for _, v := range []any{rt.query, rt.body, rt.ok} {
			if v != nil {
				walk(reflect.TypeOf(v))
			}
		}
	}
	if len(seen) < 20 {
		t.Fatalf("walked %d types only", len(seen))
	}
}

// TestOpenAPIDocumentForGenerators: the document keeps to what OpenAPI
// 3.0 parsers (oapi-codegen's) also read, and carries the fields' order.
func TestOpenAPIDocumentForGenerators(t *testing.T) {
	raw, err := OpenAPIDocument("test")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var walk func(v any, path string)
	walk = func(v any, path string) {
		switch v := v.(type) {
		case map[string]any:
			for k, sub := range v {
				if _, ok := sub.(bool); ok && (k == "items" || k == "additionalProperties") {
					t.Errorf("%s/%s is a boolean schema", path, k)
				}
				walk(sub, path+"/"+k)
			}
		case []any:
			for _, sub := range v {
				walk(sub, path)
			}
		}
	}
	walk(doc, "")
	sandbox := doc["components"].(map[string]any)["schemas"].(map[string]any)["Sandbox"].(map[string]any)["properties"].(map[string]any)
	if sandbox["sandboxId"].(map[string]any)[xOrder] != 0.0 || sandbox["forkedFrom"].(map[string]any)[xOrder] != 8.0 {
		t.Errorf("Sandbox's fields are not in the order of the Go type: %v", sandbox)
	}
}
