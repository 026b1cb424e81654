package main

import (
	"log/slog"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/sandboxd/sandboxd/internal/agents"
	"github.com/sandboxd/sandboxd/internal/persist"
	"github.com/sandboxd/sandboxd/internal/runs"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/volumes"
)

// sandboxOptions are the flags of the sandbox manager: sandboxes'
// lifetimes and how many an account and the node may have.
type sandboxOptions struct {
	timeout, maxTimeout, maxPaused time.Duration
	perAccount                     int
	diskReserveMiB                 int64
	setupOnFirstUse                bool
	// keep leaves the node's sandboxes running at shutdown (node.stop).
	keep bool
	// The accounts' volumes (internal/volumes).
	volumesPerAccount            int
	volumeQuotaGiB, volumeMaxGiB int64
}

func (o *sandboxOptions) register(f *pflag.FlagSet) {
	f.DurationVar(&o.timeout, "sandbox-timeout", 10*time.Minute, "default sandbox lifetime (env SANDBOXD_SANDBOX_TIMEOUT)")
	f.DurationVar(&o.maxTimeout, "sandbox-max-timeout", 24*time.Hour, "longest lifetime a request may ask for (env SANDBOXD_SANDBOX_MAX_TIMEOUT)")
	f.DurationVar(&o.maxPaused, "max-paused", 7*24*time.Hour, "longest a sandbox may stay paused (its timeout does not run meanwhile): past it the sandbox is stopped and its saved memory deleted; 0 unlimited (env SANDBOXD_MAX_PAUSED)")
	f.IntVar(&o.perAccount, "max-sandboxes-per-account", 10, "concurrent sandboxes per account; 0 unlimited")
	f.Int64Var(&o.diskReserveMiB, "disk-reserve-mib", 1024, "MiB of the data directory's disk never promised to sandboxes: a create whose disk the node could not honour if every sandbox filled its own is refused (429), and so is a pause or fork whose saved memory it could not hold besides")
	f.BoolVar(&o.keep, "keep-sandboxes", true, "leave this node's sandboxes running on shutdown (they are re-attached at the next start); false stops them")
	f.BoolVar(&o.setupOnFirstUse, "setup-on-first-use", true, "run the setup-sandbox task for an account's first sandbox")
	f.IntVar(&o.volumesPerAccount, "max-volumes-per-account", volumes.DefaultLimits.Count, "volumes an account may have; 0 unlimited")
	f.Int64Var(&o.volumeQuotaGiB, "volume-quota-gib", volumes.DefaultLimits.Bytes/volumes.GiB, "GiB an account's volumes may take in all (their sizes summed); 0 unlimited")
	f.Int64Var(&o.volumeMaxGiB, "max-volume-gib", volumes.DefaultLimits.MaxBytes/volumes.GiB, "GiB one volume may take; 0 unlimited")
}

func (o *sandboxOptions) check() error {
	return firstError(
		atLeast("sandbox-timeout", o.timeout, time.Second, "1s or more"),
		atLeast("sandbox-max-timeout", o.maxTimeout, time.Second, "1s or more"),
		atLeast("max-paused", o.maxPaused, 0, "0 (unlimited) or more"),
		atLeast("max-sandboxes-per-account", o.perAccount, 0, "0 (unlimited) or more"),
		atLeast("disk-reserve-mib", o.diskReserveMiB, 0, "0 or more"),
		atLeast("max-volumes-per-account", o.volumesPerAccount, 0, "0 (unlimited) or more"),
		atLeast("volume-quota-gib", o.volumeQuotaGiB, 0, "0 (unlimited) or more"),
		atLeast("max-volume-gib", o.volumeMaxGiB, 0, "0 (unlimited) or more"),
	)
}

// setupManager builds the sandbox manager of this node: its sandboxes'
// settings, the access rule, persistence, the hooks of every sandbox's
// life, and the setup runs it starts for an account's first sandbox.
func setupManager(o *serveOptions, d domainDeps, dom *domain, setups *agents.Setups, log *slog.Logger) *sandbox.Manager {
	s, r := o.sandboxes, o.runtime
	return sandbox.NewManager(sandbox.Config{
		Store: d.stor.st, Runtime: d.rt.rt, Jobs: dom.jobs, NodeID: d.stor.nodeID, DataDir: d.stor.dataDir, Access: dom.authn,
		BaseDir: d.rt.baseDir, BaseID: d.rt.baseID, Home: d.stor.homeSocket(),
		Settings: sandbox.Settings{
			DefaultTimeout: s.timeout, MaxTimeout: s.maxTimeout, MaxPaused: s.maxPaused,
			PerAccount: s.perAccount, NodeCapacity: r.nodeCapacity, Limits: d.rt.limits,
			DiskReserveBytes: s.diskReserveMiB<<20 + d.stor.cacheBytes(),
			WarmSandboxes:    r.warmSandboxes(),
			WarmPoolMax:      r.warmSandboxesMax(),
			TemplatePool:     r.templatePool,
			SetupOnFirstUse:  s.setupOnFirstUse,
			Model:            runs.ModelProvider{BaseURL: o.models.modelURL, Model: o.models.model},
			Commands:         agentCommands(d.rt.baseDir),
			Image:            r.imageName(),
			Network:          d.nw.policy,
		},
		Persist:   dom.persist,
		Templates: dom.catalog,
		Volumes:   dom.volumes,
		// A cluster's nodes resume each other's paused sandboxes from the
		// blob store they share.
		Blobs: d.stor.blobs, MovePauses: o.cluster.enabled(),
		Hooks:  append(sandboxHooks(d.stor.st, o.models.anthropicProxy(), d.nw, dom.persist), dom.volumes),
		Logger: log.With("component", "sandbox"),

		LogMaxBytes: r.logMaxMiB << 20,
		Setups:      setups,
	})
}

// setupVolumes builds the accounts' volumes: their images in the data
// dir's volumes/, synced through the blob store between a cluster's nodes.
func setupVolumes(o *serveOptions, d domainDeps, log *slog.Logger) (*volumes.Service, error) {
	s := o.sandboxes
	return volumes.New(volumes.Config{
		Store: d.stor.st, Blobs: d.stor.blobs, Sync: o.cluster.enabled(), NodeID: d.stor.nodeID,
		Dir: filepath.Join(d.stor.dataDir, "volumes"), Runtime: d.rt.rt.Name(),
		Limits: volumes.Limits{Count: s.volumesPerAccount, Bytes: s.volumeQuotaGiB * volumes.GiB, MaxBytes: s.volumeMaxGiB * volumes.GiB},
		Logger: log,
	})
}

// sandboxHooks are the concerns plugged into every sandbox's life, in the
// order they run: its own key, its network (when the server has
// networking), and persistence's (git's credentials, the account's
// snapshot).
func sandboxHooks(st *store.Store, anthropicProxy bool, nw *network, persistence *persist.Service) []sandbox.Hook {
	hooks := []sandbox.Hook{sandbox.NewKeyHook(sandbox.KeyHookConfig{
		Store: st,
		// No operator credential goes into a sandbox: models are reached
		// through the model proxy, GitHub from the host.
		AnthropicProxy: anthropicProxy,
	})}
	if nw.mgr != nil {
		hooks = append(hooks, sandbox.NewNetworkHook(nw.mgr))
	}
	return append(hooks, persistence.Hooks()...)
}
