package main

import (
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/bench"
)

func TestPrintCluster(t *testing.T) {
	r := bench.ClusterReport{Nodes: 2, CPUs: 2, PGStats: "pg_stat_statements", DownAfter: "10s",
		Creates: []bench.ClusterPhase{{Name: "create", Concurrency: 8, Latency: bench.Latency{N: 10, OK: 9, P50: 4, P99: 9},
			PerSecond: 100, Errors: 1, FirstError: "HTTP 429",
			PG: bench.PGCost{PerOp: 12, Top: []bench.PGStatement{{Calls: 7, Query: "SELECT 1"}}}}},
		Failure: &bench.FailureDetection{Sandboxes: 3, DownSeconds: 11.2, FailedSeconds: 11.3},
	}
	var b strings.Builder
	printCluster(&b, r)
	for _, want := range []string{"2 nodes", "create", "9/10", "1 errors, the first: HTTP 429", "declared down after 11.2s", "SELECT 1"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in\n%s", want, b.String())
		}
	}
}

func TestFakeRuntimeNeedsItsVariable(t *testing.T) {
	t.Setenv(EnvFakeRuntime, "")
	o := runtimeOptions{runtimeName: "fake", template: "base", logMaxMiB: 16, memoryMiB: 1, pids: 1}
	if err := o.check(); err == nil || !strings.Contains(err.Error(), EnvFakeRuntime) {
		t.Fatalf("--runtime fake without %s: %v", EnvFakeRuntime, err)
	}
	t.Setenv(EnvFakeRuntime, "1")
	if err := o.check(); err != nil {
		t.Fatalf("--runtime fake with %s=1: %v", EnvFakeRuntime, err)
	}
}
