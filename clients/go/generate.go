// Package client (clients/go) is a Go client of the sandboxd API, generated from the
// OpenAPI document the server serves (GET /api/openapi.json), of which
// api/openapi.json is the committed copy, with oapi-codegen (pinned in
// go.mod's tool directive). client.gen.go is generated; client.go adds
// the little the generated code lacks: the API key, and the API's error
// answers as one error type.
//
//	c, err := client.New("http://127.0.0.1:8080", os.Getenv("SANDBOXD_API_KEY"))
//	...
//	res, err := client.Check(c.PostSandboxesWithResponse(ctx, client.CreateSandboxRequest{}))
//	if err != nil { ... } // a *client.Error for an error answer: its status and body
//	id := res.JSON200.Sandboxes[0].SandboxID
//
// After a change of the API's types or routes, `go generate ./clients/go`
// rewrites both the document and the client; tests fail until then.
package client

// The document first, from the same code the server serves it from, then
// the client from the document.
//go:generate go run ../../cmd/sandboxd openapi -o ../../api/openapi.json
//go:generate go tool oapi-codegen -config oapi-codegen.yaml ../../api/openapi.json
