// Package cluster is what lets several sandboxd nodes serve as one: the
// node-to-node channel (requests for a sandbox hosted on another node are
// forwarded to that node's cluster listener, signed with the cluster's
// shared secret and naming the caller's key by its id, never carrying the
// key itself) and placement (a new sandbox goes to the freer of K healthy
// nodes picked at random that have what it needs).
//
// Membership — registration, heartbeats, declaring a silent node down —
// is package membership's, which has package sandbox fail what a down node
// hosted; this package reads the node rows membership keeps. They are
// apart because this package is the channel and the placement (what a
// request needs), membership a node's own lifecycle (what the process runs
// in the background), and neither needs the other's code.
//
// Files, by subject: sign.go (the shared secret and the signature of a
// forwarded request), forward.go (Forwarder: one request carried to another
// node), keyprotocol.go (a websocket key kept off the other node),
// unreachable.go (a forward that failed: the answer and the operator's
// hint), router.go (Router: which node hosts a sandbox, forwarding to it),
// place.go (where a new sandbox goes), tls.go and certs.go (the cluster
// listener's TLS and the certificates for it), repos.go (the accounts'
// repositories shared through the database and the blob store).
package cluster
