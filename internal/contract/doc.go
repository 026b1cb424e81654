// Package contract is sandboxd's REST contract (docs/API.md) as Go: the
// request and response types the OpenAPI document is generated from, the
// decoding and validation of bodies and queries with the contract's exact
// messages, and the views of sandboxes and runs. The REST API (internal/api)
// serves it; MCP (internal/mcpserver) speaks it too, through Args, so that
// both validate and answer alike without one front end importing the other.
// It knows nothing of routes, callers or the cluster (internal/edge).
package contract
