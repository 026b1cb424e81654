# sandboxd — the two commands of the quick start are `make run` and `make test`.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
BIN := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
# Brief coverage-guided fuzzing of the request decoders on every test run.
# A count, not a duration: with a duration, Go 1.26's fuzzing coordinator
# can report its own deadline as a failure with no crashing input
# (golang/go#75804, fixed in Go 1.27).
FUZZTIME ?= 25000x

.PHONY: all deps build run test unit e2e fuzz lint bench security security-doc structure clean

all: build

deps:
	@scripts/install-deps.sh

# sandbox-agent runs inside sandboxes: static, next to sandboxd.
build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/sandboxd ./cmd/sandboxd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/sandbox-agent ./cmd/sandbox-agent

# Install what is missing, then serve on embedded defaults (SQLite and local
# disk under ./data) at http://127.0.0.1:8080, with the full template (the
# agent CLIs; built on first use with progress, a few minutes once).
run: deps build
	$(BIN)/sandboxd serve

# The whole suite: unit and integration tests (SQLite and a throwaway
# PostgreSQL, real sandboxes), end-to-end tests against a real server, and a
# short fuzzing pass over the request decoders.
# The microVM guest kernel and the full image (serve's default, whose agent
# CLIs the tests run) are built first (≈ 10 and ≈ 5 minutes once; cached in
# ~/.cache/sandboxd).
# Every test that attacks a boundary records itself (internal/securitytest)
# in $(SECURITY_RECORDS); `make security` renders them into SECURITY.md.
SECURITY_RECORDS := $(CURDIR)/$(BIN)/security-attacks.jsonl
# Tests that make artifacts (the console test's screenshots) put them here.
ARTIFACTS := $(CURDIR)/$(BIN)/artifacts
test: deps build
	@scripts/install-test-tools.sh
	$(BIN)/sandboxd kernel build
	$(BIN)/sandboxd image build --template full
	$(BIN)/sandboxd image build --template code-interpreter
	rm -f $(SECURITY_RECORDS)
	SANDBOXD_SECURITY_REPORT=$(SECURITY_RECORDS) SANDBOXD_ARTIFACTS=$(ARTIFACTS) SANDBOXD_REQUIRE_POSTGRES=1 SANDBOXD_REQUIRE_RUNTIME=1 SANDBOXD_REQUIRE_S3=1 SANDBOXD_REQUIRE_MICROVM=1 SANDBOXD_TEST_IMAGES_FULL=1 $(GO) test -count=1 -timeout 60m ./...
	$(MAKE) fuzz

# SECURITY.md's table of attacks, from what the suite really performed: the
# whole suite, then its records rendered between the markers of SECURITY.md.
# `make security-doc RECORDS=path` renders the records of an earlier run.
RECORDS ?= $(SECURITY_RECORDS)
security: test security-doc
security-doc:
	$(GO) run ./cmd/security-report -records $(RECORDS) -doc SECURITY.md

unit:
	$(GO) test -count=1 ./internal/...

e2e:
	$(GO) test -count=1 -v ./e2e/...

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzCreateSandboxBody$$' -fuzztime $(FUZZTIME) ./internal/api
	$(GO) test -run '^$$' -fuzz '^FuzzUploadFilesBody$$' -fuzztime $(FUZZTIME) ./internal/api
	$(GO) test -run '^$$' -fuzz '^FuzzRequests$$' -fuzztime $(FUZZTIME) ./internal/api
	$(GO) test -run '^$$' -fuzz '^FuzzStripper$$' -fuzztime $(FUZZTIME) ./internal/escstrip

lint:
	gofmt -l . | (! grep .)
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

# The structure figures (packages, lines, the longest functions, imports
# between front ends, sandbox.Manager's entry points) of a change's note.
structure:
	@scripts/structure-metrics.sh

bench: build
	$(BIN)/sandboxd bench

clean:
	rm -rf $(BIN)
