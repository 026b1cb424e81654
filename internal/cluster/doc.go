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
package cluster
