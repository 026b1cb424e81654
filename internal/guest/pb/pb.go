// Package pb holds the Go code generated from the guest protocol's IDL
// (proto/ at the repository's root): the envd-shaped process and
// filesystem services and sandboxd's own agent service, as protobuf
// messages and Connect clients and handlers. Nothing here is written by
// hand; `go generate ./internal/guest/pb` regenerates it with the pinned
// buf and the plugins pinned as tools in go.mod, and TestGeneratedIsCurrent
// fails when the committed code is stale.
package pb

//go:generate sh -c "cd ../../.. && go run github.com/bufbuild/buf/cmd/buf@v1.75.0 generate proto --template proto/buf.gen.yaml"
