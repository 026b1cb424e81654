// Package archtest holds tests only: the structure rules of the module,
// checked by reading its source (go/parser, no build), so that the map in
// docs/ARCHITECTURE.md and the layering it draws cannot drift from the code
// unnoticed:
//
//   - every Go package under internal/ has a row in ARCHITECTURE.md's
//     package table, and every row names a package that exists;
//   - no front end (REST, E2B, MCP, console) imports another: they are
//     peers over internal/edge;
//   - no function of serve's composition root (cmd/sandboxd/serve.go and
//     serve_*.go) is longer than 80 lines.
//
// It also prints the structure figures scripts/structure-metrics.sh quotes
// (the longest functions, the imports between front ends, sandbox.Manager's
// entry points) when ARCHTEST_REPORT is set. Nothing imports it.
package archtest
