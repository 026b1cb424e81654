package main

import (
	"log/slog"
	"path/filepath"

	"github.com/riverqueue/river"
	"github.com/spf13/pflag"

	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// templatesOptions are the flags of templates (docs/TEMPLATES.md).
type templatesOptions struct {
	allowPrivate bool
}

func (o *templatesOptions) register(f *pflag.FlagSet) {
	f.BoolVar(&o.allowPrivate, "templates-allow-private-registries", false, "let templates be built from registries on private, loopback and link-local addresses (never metadata addresses)")
}

// setupTemplates builds the templates service over the node's cache of
// unpacked images (<data>/templates, root only) and registers its build
// worker.
func setupTemplates(o templatesOptions, stor *storage, jc *jobs.Client, workers *river.Workers, log *slog.Logger) (*templates.Service, error) {
	svc, err := templates.New(templates.Config{
		Store: stor.st, Jobs: jc, NodeID: stor.nodeID, Dir: filepath.Join(stor.dataDir, "templates"),
		AllowPrivate: o.allowPrivate, Logger: log.With("component", "templates"),
	})
	if err != nil {
		return nil, err
	}
	svc.RegisterWorkers(workers)
	return svc, nil
}
