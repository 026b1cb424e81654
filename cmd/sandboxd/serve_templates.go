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
}

func (o *templatesOptions) register(f *pflag.FlagSet) {
	f.BoolVar(&o.allowPrivate, "templates-allow-private-registries", false, "let templates be built from registries on private, loopback and link-local addresses (never metadata addresses)")
	f.DurationVar(&o.stepTimeout, "templates-step-timeout", templates.DefaultStepTimeout, "longest one step (RUN) of a template build may take")
	f.DurationVar(&o.buildTimeout, "templates-build-timeout", templates.DefaultBuildTimeout, "longest a whole template build may take (the image's fetch and every step)")
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
// unpacked images, starting build sandboxes and saving sandboxes through
// mgr, and registers its build worker. builtin is the server's built-in
// image, the base of templates saved from sandboxes on it.
func setupTemplates(o templatesOptions, stor *storage, jc *jobs.Client, mgr *sandbox.Manager, builtin templates.Builtin, workers *river.Workers, log *slog.Logger) (*templates.Service, error) {
	svc, err := templates.New(templates.Config{
		Store: stor.st, Jobs: jc, NodeID: stor.nodeID, Dir: templatesDir(stor), Host: mgr, Saver: mgr, Builtin: builtin,
		AllowPrivate: o.allowPrivate, Blobs: stor.blobs, StepTimeout: o.stepTimeout, BuildTimeout: o.buildTimeout,
		BuildNetwork: o.buildNetwork(), Logger: log.With("component", "templates"),
	})
	if err != nil {
		return nil, err
	}
	svc.RegisterWorkers(workers)
	return svc, nil
}
