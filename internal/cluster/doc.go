// Package cluster is what lets several sandboxd nodes serve as one: the
// node-to-node channel (requests for a sandbox hosted on another node are
// forwarded to that node's cluster listener, signed with the cluster's
// shared secret and naming the caller's key by its id, never carrying the
// key itself) and placement (a new sandbox goes to the freer of K healthy
// nodes picked at random that have what it needs).
//
// Membership — registration, heartbeats, declaring a silent node down and
// failing what it hosted — lives with the sandboxes' state machine in
// package sandbox; this package reads the node rows it keeps.
package cluster
