package main

import (
	"log/slog"
	"time"

	"github.com/riverqueue/river"
	"github.com/spf13/pflag"

	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/webhooks"
)

// eventsOptions are the flags of lifecycle events and webhooks.
type eventsOptions struct {
	allowPrivate bool
	retryBase    time.Duration
	timeout      time.Duration
	keep         time.Duration
}

func (o *eventsOptions) register(f *pflag.FlagSet) {
	f.BoolVar(&o.allowPrivate, "webhooks-allow-private", false, "let webhooks reach private, loopback and link-local addresses (never metadata addresses)")
	f.DurationVar(&o.retryBase, "webhook-retry-base", 10*time.Second, "wait before a failed delivery's second attempt; each later one waits twice as long (at most an hour), 8 attempts in all")
	f.DurationVar(&o.timeout, "webhook-timeout", 10*time.Second, "longest one delivery attempt may take")
	f.DurationVar(&o.keep, "keep-events", 7*24*time.Hour, "how long lifecycle events (GET /api/events) and their ended deliveries are kept; 0 keeps them forever")
}

func (o *eventsOptions) check() error {
	return firstError(
		atLeast("webhook-retry-base", o.retryBase, 10*time.Millisecond, "10ms or more"),
		atLeast("webhook-timeout", o.timeout, 100*time.Millisecond, "100ms or more"),
		atLeast("keep-events", o.keep, 0, "0 (forever) or more"),
	)
}

// setupWebhooks builds the events and webhooks service; its workers go
// to workers, its dispatcher runs with the node (node.run). key is the
// server's sealing key (serverKey).
func setupWebhooks(o eventsOptions, stor *storage, jc *jobs.Client, workers *river.Workers, key []byte, log *slog.Logger) (*webhooks.Service, error) {
	svc, err := webhooks.New(webhooks.Config{Store: stor.st, Jobs: jc, Key: key, AllowPrivate: o.allowPrivate,
		RetryBase: o.retryBase, Timeout: o.timeout, KeepEvents: o.keep, Logger: log.With("component", "webhooks")})
	if err != nil {
		return nil, err
	}
	svc.RegisterWorkers(workers)
	return svc, nil
}
