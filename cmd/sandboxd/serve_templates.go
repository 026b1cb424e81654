package main

import (
	"log/slog"
	"path/filepath"
	"time"

	"github.com/riverqueue/river"
	"github.com/spf13/pflag"

	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// templatesOptions are the flags of templates (docs/TEMPLATES.md).
type templatesOptions struct {
	allowPrivate bool
	stepTimeout  time.Duration
	buildTimeout time.Duration
	buildAllow   []string
	maxCPUs      float64
	maxMemoryMiB int64
	maxUploadMiB int64
}

func (o *templatesOptions) register(f *pflag.FlagSet) {
	f.BoolVar(&o.allowPrivate, "templates-allow-private-registries", false, "let templates be built from registries on private, loopback and link-local addresses (never metadata addresses)")
	f.DurationVar(&o.stepTimeout, "templates-step-timeout", templates.DefaultStepTimeout, "longest one step (RUN) of a template build may take")
	f.DurationVar(&o.buildTimeout, "templates-build-timeout", templates.DefaultBuildTimeout, "longest a whole template build may take (the image's fetch and every step)")
	f.Float64Var(&o.maxCPUs, "templates-build-max-cpus", 0, "most CPUs a build may ask for its build sandboxes (E2B's cpuCount); 0: this host's CPUs, at least 2")
	f.Int64Var(&o.maxMemoryMiB, "templates-build-max-memory-mib", templates.DefaultMaxBuildMemoryMiB, "most memory in MiB a build may ask for its build sandboxes (E2B's memoryMB)")
	f.Int64Var(&o.maxUploadMiB, "templates-max-upload-mib", templates.DefaultMaxUploadBytes>>20, "largest archive of build files (for COPY) one upload may weigh; it may unpack to four times that")
	f.StringSliceVar(&o.buildAllow, "templates-build-allow", nil, "the build sandboxes' network as an allow list (CIDRs, addresses, domains, *.wildcards); default: egress to public addresses")
}

// buildNetwork is the build sandboxes' network policy.
func (o *templatesOptions) buildNetwork() netpol.Policy {
	if len(o.buildAllow) > 0 {
		return netpol.Policy{Mode: netpol.ModeAllow, Allow: o.buildAllow}
	}
	return netpol.Policy{Mode: netpol.ModeEgress}
}

// templatesDir is the node's cache of unpacked images (root only).
func templatesDir(stor *storage) string { return filepath.Join(stor.dataDir, "templates") }

// serverKey is the key that seals what the server keeps secret in its
// database (builds' registry credentials, webhooks' signing secrets; each
// derives a key of its own from it): in a cluster, made from its secret
// (any node opens what another sealed); else this node's own, in
// credentialsKeyFile.
func serverKey(stor *storage, clusterSecret []byte) ([]byte, error) {
	if len(clusterSecret) > 0 {
		return templates.KeyFromSecret(clusterSecret), nil
	}
	return templates.LoadOrCreateKey(credentialsKeyFile(stor))
}

// credentialsKeyFile holds the key that seals template builds' registry
// credentials on a node outside a cluster (made at first start, 0600).
func credentialsKeyFile(stor *storage) string {
	return filepath.Join(stor.dataDir, "registry-credentials.key")
}

// setupTemplates builds the templates service over the node's cache of
// unpacked images, starting build sandboxes and saving sandboxes through
// mgr, and registers its build worker. builtin is the server's built-in
// image, the base of templates saved from sandboxes on it.
func setupTemplates(o templatesOptions, stor *storage, jc *jobs.Client, mgr *sandbox.Manager, builtin templates.Builtin, workers *river.Workers, clusterSecret []byte, log *slog.Logger) (*templates.Service, error) {
	if o.maxUploadMiB < 1 || o.maxUploadMiB > 1<<20 {
		return nil, flagErrorf("templates-max-upload-mib", "--templates-max-upload-mib %d: want 1 to %d", o.maxUploadMiB, 1<<20)
	}
	key, err := serverKey(stor, clusterSecret)
	if err != nil {
		return nil, err
	}
	svc, err := templates.New(templates.Config{
		Store: stor.st, Jobs: jc, NodeID: stor.nodeID, Dir: templatesDir(stor), Host: mgr, Saver: mgr, Builtin: builtin,
		AllowPrivate: o.allowPrivate, Blobs: stor.blobs, StepTimeout: o.stepTimeout, BuildTimeout: o.buildTimeout,
		BuildNetwork: o.buildNetwork(), MaxBuildCPUs: o.maxCPUs, MaxBuildMemoryMiB: o.maxMemoryMiB, Logger: log.With("component", "templates"),
		CredentialsKey: key,
		// Upload links are signed with a key derived from the same one:
		// any node of a cluster takes them, and a restart keeps them.
		MaxUploadBytes: o.maxUploadMiB << 20, UploadSecret: key,
	})
	if err != nil {
		return nil, err
	}
	svc.RegisterWorkers(workers)
	return svc, nil
}
