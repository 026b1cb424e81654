package main

import (
	"log/slog"
	"path/filepath"
	"time"

	"github.com/riverqueue/river"
	"github.com/spf13/pflag"

	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// templatesOptions are the flags of templates (docs/TEMPLATES.md).
type templatesOptions struct {
	allowPrivate bool
	stepTimeout  time.Duration
	buildTimeout time.Duration
	buildAllow   []string
	maxUploadMiB int64
	// uploadSecret signs upload links: the cluster's secret when there
	// is one (set by serve, not a flag).
	uploadSecret []byte
}

func (o *templatesOptions) register(f *pflag.FlagSet) {
	f.BoolVar(&o.allowPrivate, "templates-allow-private-registries", false, "let templates be built from registries on private, loopback and link-local addresses (never metadata addresses)")
	f.DurationVar(&o.stepTimeout, "templates-step-timeout", templates.DefaultStepTimeout, "longest one step (RUN) of a template build may take")
	f.DurationVar(&o.buildTimeout, "templates-build-timeout", templates.DefaultBuildTimeout, "longest a whole template build may take (the image's fetch and every step)")
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

// setupTemplates builds the templates service over the node's cache of
// unpacked images, starting build sandboxes through host, and registers
// its build worker.
func setupTemplates(o templatesOptions, stor *storage, jc *jobs.Client, host templates.BuildHost, workers *river.Workers, log *slog.Logger) (*templates.Service, error) {
	if o.maxUploadMiB < 1 || o.maxUploadMiB > 1<<20 {
		return nil, flagErrorf("templates-max-upload-mib", "--templates-max-upload-mib %d: want 1 to %d", o.maxUploadMiB, 1<<20)
	}
	svc, err := templates.New(templates.Config{
		Store: stor.st, Jobs: jc, NodeID: stor.nodeID, Dir: templatesDir(stor), Host: host,
		AllowPrivate: o.allowPrivate, Blobs: stor.blobs, StepTimeout: o.stepTimeout, BuildTimeout: o.buildTimeout,
		BuildNetwork: o.buildNetwork(), MaxUploadBytes: o.maxUploadMiB << 20, UploadSecret: o.uploadSecret,
		Logger: log.With("component", "templates"),
	})
	if err != nil {
		return nil, err
	}
	svc.RegisterWorkers(workers)
	return svc, nil
}
