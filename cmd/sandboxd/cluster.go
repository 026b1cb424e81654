package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	goruntime "runtime"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/cluster"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/membership"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// clusterOptions are serve's flags for running as one node of several.
type clusterOptions struct {
	listen     string // the cluster listener; set: cluster mode
	address    string // as other nodes reach it (default: listen)
	secretFile string
	downAfter  time.Duration
	choices    int
	// Mutual TLS on the cluster listener and the forwards: all three or
	// none.
	tlsCert, tlsKey, tlsCA string

	// secret and tls are what check loaded from the files named.
	secret cluster.Secret
	tls    *cluster.TLS
}

func (c *clusterOptions) register(f *pflag.FlagSet) {
	f.StringVar(&c.listen, "cluster-listen", "", "address of this node's cluster listener, where other nodes forward requests for the sandboxes it hosts; setting it runs this node as one of a cluster (needs --database postgres://..., an S3 --blob-store and --cluster-secret-file; see docs/CLUSTER.md)")
	f.StringVar(&c.address, "node-address", "", "host:port other nodes reach this node's cluster listener at (default: --cluster-listen, which must then name a host)")
	f.StringVar(&c.secretFile, "cluster-secret-file", "", "file holding the cluster's shared secret (at least 32 bytes, the same on every node): forwarded requests are signed with it")
	f.DurationVar(&c.downAfter, "node-down-after", 30*time.Second, "a node whose heartbeat is older is declared down: its sandboxes fail, and it destroys them if it comes back")
	f.IntVar(&c.choices, "placement-choices", 2, "best-of-K placement: a new sandbox goes to the freest of K healthy nodes picked at random")
	f.StringVar(&c.tlsCert, "cluster-tls-cert", "", "this node's certificate (PEM) for mutual TLS between nodes, naming the host of --node-address (sandboxd admin cluster-cert node); with --cluster-tls-key and --cluster-tls-ca, the cluster listener serves TLS 1.3 only and requires a client certificate of the CA, and forwards go over TLS")
	f.StringVar(&c.tlsKey, "cluster-tls-key", "", "the private key (PEM) of --cluster-tls-cert")
	f.StringVar(&c.tlsCA, "cluster-tls-ca", "", "the cluster's CA certificate (PEM) that every node's certificate must chain to")
}

// checkTLS refuses a partial mutual TLS setting, naming what is missing,
// and TLS without a cluster listener to use it: either would otherwise
// run without the protection the operator asked for.
func (c *clusterOptions) checkTLS() error {
	given := map[string]string{"--cluster-tls-cert": c.tlsCert, "--cluster-tls-key": c.tlsKey, "--cluster-tls-ca": c.tlsCA}
	var set, missing []string
	for _, name := range []string{"--cluster-tls-cert", "--cluster-tls-key", "--cluster-tls-ca"} {
		if given[name] != "" {
			set = append(set, name)
		} else {
			missing = append(missing, name)
		}
	}
	if len(set) == 0 {
		return nil
	}
	flags := []string{"cluster-tls-cert", "cluster-tls-key", "cluster-tls-ca"}
	if len(missing) > 0 {
		return &flagError{flags, fmt.Errorf("mutual TLS between nodes needs --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca together: %s given without %s", strings.Join(set, ", "), strings.Join(missing, ", "))}
	}
	if !c.enabled() {
		return &flagError{flags, errors.New("--cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca secure the cluster listener: give --cluster-listen too (see docs/CLUSTER.md)")}
	}
	return nil
}

// tlsEnabled says the node runs mutual TLS with the other nodes.
func (c *clusterOptions) tlsEnabled() bool { return c.tlsCert != "" }

// loadTLS reads the node's certificates (nil without TLS) and checks that
// the others will take them: from the CA, valid now, naming the host of
// the address they reach this node at.
func (c *clusterOptions) loadTLS(now time.Time) (*cluster.TLS, error) {
	if !c.tlsEnabled() {
		return nil, nil
	}
	t, err := cluster.LoadTLS(c.tlsCert, c.tlsKey, c.tlsCA, now)
	if err != nil {
		return nil, err
	}
	if err := t.CheckAddress(c.address); err != nil {
		return nil, flagErrorf("cluster-tls-cert", "--cluster-tls-cert %s: %w", c.tlsCert, err)
	}
	return t, nil
}

// enabled says serve runs as a node of a cluster.
func (c *clusterOptions) enabled() bool { return c.listen != "" }

// check refuses, before serve starts anything, a cluster configuration
// that cannot work: partial TLS, cluster mode without what it needs, an
// address the other nodes cannot reach. It loads the secret and the
// certificates.
func (c *clusterOptions) check(blobURL string) error {
	if err := c.checkTLS(); err != nil {
		return err
	}
	if !c.enabled() {
		return nil
	}
	var missing []string
	if c.secretFile == "" {
		missing = append(missing, "--cluster-secret-file")
	}
	if !strings.HasPrefix(blobURL, "s3://") {
		missing = append(missing, "an S3 --blob-store (snapshots must be readable from every node; DATA_DIR/blobs is this node's alone)")
	}
	if len(missing) > 0 {
		return flagErrorf("cluster-listen", "--cluster-listen needs %s", strings.Join(missing, ", "))
	}
	if c.address == "" {
		host, _, err := net.SplitHostPort(c.listen)
		if err != nil {
			return flagErrorf("cluster-listen", "--cluster-listen %q: %w", c.listen, err)
		}
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			return flagErrorf("cluster-listen", "--cluster-listen %s listens on every address: give --node-address, the host:port other nodes reach it at", c.listen)
		}
		c.address = c.listen
	}
	if c.downAfter < time.Second {
		return flagErrorf("node-down-after", "--node-down-after %v: at least 1s", c.downAfter)
	}
	if err := atLeast("placement-choices", c.choices, 1, "1 or more"); err != nil {
		return err
	}
	var err error
	if c.secret, err = cluster.LoadSecret(c.secretFile); err != nil {
		return flagErrorf("cluster-secret-file", "--cluster-secret-file: %w", err)
	}
	c.tls, err = c.loadTLS(time.Now())
	return err
}

// checkDatabase refuses a node of a cluster on a database the others
// cannot share, and a second node on one database without a cluster: a
// single node's local repositories and blobs cannot be shared.
func (c *clusterOptions) checkDatabase(ctx context.Context, st *store.Store, nodeID string) error {
	if c.enabled() {
		if st.Dialect() != store.DialectPostgres {
			return flagErrorf("cluster-listen", "--cluster-listen needs --database postgres://... (every node shares one database)")
		}
		return nil
	}
	nodes, err := st.ListNodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.ID != nodeID && n.Status == store.NodeUp && time.Since(n.HeartbeatAt) < 30*time.Second {
			return fmt.Errorf("node %s (%s) is serving from this database too: several nodes must run as a cluster (--cluster-listen, --cluster-secret-file, PostgreSQL and an S3 --blob-store; see docs/CLUSTER.md)", n.ID, n.Hostname)
		}
	}
	return nil
}

// nodeCapacity is what this node offers new sandboxes.
func nodeCapacity(rt runtime.Runtime, dataDir string, maxSandboxes int, network bool) store.NodeCapacity {
	caps := rt.Capabilities()
	_, forks := rt.(runtime.Forker)
	c := store.NodeCapacity{
		CPUs: goruntime.NumCPU(), MaxSandboxes: maxSandboxes, Runtime: rt.Name(),
		Network: caps.Network && network, MemorySnapshot: caps.MemorySnapshot, Fork: forks,
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		c.MemoryBytes = int64(si.Totalram) * int64(si.Unit)
	}
	var fs unix.Statfs_t
	if unix.Statfs(dataDir, &fs) == nil {
		c.DiskBytes = int64(fs.Bavail) * fs.Bsize
	}
	return c
}

// certWarnBefore is how long before its certificate expires a node warns
// at start.
const certWarnBefore = 30 * 24 * time.Hour

// clusterParts are what cluster mode adds to serve: the node's info for
// the manager, the API's router, and the listener's server.
type clusterParts struct {
	node      membership.NodeInfo
	downAfter time.Duration
	router    *cluster.Router
	ln        net.Listener
	tlsUntil  time.Time // when the node's TLS certificate expires (zero: no TLS)
}

// open loads the secret, builds the router and listens; nothing when not
// in cluster mode.
func (c *clusterOptions) open(st *store.Store, nodeID string, capacity store.NodeCapacity, defaultNetwork bool, log *slog.Logger) (*clusterParts, error) {
	p := &clusterParts{node: membership.NodeInfo{Capacity: capacity, Version: version}}
	if !c.enabled() {
		return p, nil
	}
	secret, tlsConf := c.secret, c.tls
	p.node.Address, p.downAfter = c.address, c.downAfter
	p.router = cluster.NewRouter(cluster.RouterConfig{
		Store: st, NodeID: nodeID, Secret: secret, TLS: tlsConf, Choices: c.choices, DownAfter: c.downAfter,
		DefaultNetwork: defaultNetwork, Logger: log.With("component", "cluster"),
	})
	var err error
	if p.ln, err = net.Listen("tcp", c.listen); err != nil {
		return nil, fmt.Errorf("listen on %s: %w", c.listen, err)
	}
	if tlsConf != nil {
		p.ln = tlsConf.Listener(p.ln)
		p.tlsUntil = tlsConf.NotAfter()
	}
	return p, nil
}

// serve serves the cluster listener with h until shutdown; errors go to
// errc. It returns the server to shut down (nil when not in cluster mode).
func (p *clusterParts) serve(h http.Handler, log *slog.Logger, errc chan<- error) *http.Server {
	if p.ln == nil {
		return nil
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go func() {
		if err := srv.Serve(p.ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("cluster listener: %w", err)
		}
	}()
	if p.tlsUntil.IsZero() {
		log.Info("cluster listener serving", "addr", p.ln.Addr().String(), "node_address", p.node.Address, "tls", false)
		return srv
	}
	log.Info("cluster listener serving", "addr", p.ln.Addr().String(), "node_address", p.node.Address, "tls", true, "cert_not_after", p.tlsUntil)
	// An expired certificate stops every forward to and from this node:
	// say so while there is time to renew it.
	if left := time.Until(p.tlsUntil); left < certWarnBefore {
		log.Warn("the cluster TLS certificate expires soon: make a new one (sandboxd admin cluster-cert node) and restart", "cert_not_after", p.tlsUntil, "left", left.Round(time.Hour))
	}
	return srv
}

// edgeCluster is the edge's view of the cluster (edge.Cluster), which every
// front end asks: nil (a single node) unless in cluster mode. (A nil
// *cluster.Router in the interface would not be.)
func edgeCluster(p *clusterParts) edge.Cluster {
	if p.router == nil {
		return nil
	}
	return p.router
}

// sharedRepos is how the repositories are shared with the other nodes:
// not at all (nil) outside cluster mode.
func sharedRepos(c *clusterOptions, st *store.Store, blobs blob.Store, nodeID string) repo.Shared {
	if !c.enabled() {
		return nil
	}
	return cluster.NewRepos(st, blobs, nodeID)
}
