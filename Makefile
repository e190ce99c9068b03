SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-builtin-rules --no-print-directory

DEVDB := scripts/devdb.sh
SECRET_FILE := .service/secret

# Fuzz targets run by fuzz-short (and so by test): space-separated
# <package>:<FuzzName> entries, e.g. ./internal/wire:FuzzDecode.
FUZZ_TARGETS ?= ./internal/rpc:FuzzDecoders ./internal/admission:FuzzTimestampNS ./internal/agent/egressproxy:FuzzPeekName ./internal/wire:FuzzParseObject ./internal/wire:FuzzParseFastMatches ./internal/wire:FuzzPatternAgreesWithRegexp ./internal/config:FuzzLoadFile ./internal/reqmeta:FuzzRequestID ./internal/reqmeta:FuzzTraceparent ./internal/secrets:FuzzParseReference ./internal/cursor:FuzzOpen ./internal/ids:FuzzDerive ./internal/iam:FuzzSourceIP ./internal/guest:FuzzDecodeRequest ./internal/guestproto:FuzzReader ./internal/providers:FuzzCheckConfig ./internal/profiles:FuzzCheck ./tools/loadbench:FuzzReadResponse
FUZZ_TIME ?= 10s

# SERVICE_ENV runs first in recipes that need the service's environment.
# Unless the caller set them, SERVICE_DATABASE_URL points at the private
# cluster under .service/ (started on demand) and SERVICE_SECRET is the one
# kept in .service/secret.
SERVICE_ENV = \
	if [[ -z "$${SERVICE_DATABASE_URL:-}" ]]; then \
		SERVICE_DATABASE_URL="$$($(DEVDB) start)"; export SERVICE_DATABASE_URL; \
	fi; \
	if [[ -z "$${SERVICE_SECRET:-}" ]]; then \
		SERVICE_SECRET="$$(cat $(SECRET_FILE))"; export SERVICE_SECRET; \
	fi

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-12s %s\n", $$1, $$2}'

.PHONY: gen
gen: ## Regenerate gen/, openapi.yaml and the client from catalog/, queries/ and migrations/
	go run ./tools/catalogc gen
	go tool sqlc generate
	go tool ogen --loglevel warn --target gen/client --package client --clean --config tools/ogen.yaml openapi.yaml

.PHONY: freeze
freeze: ## Record the current API surface in catalog/frozen/
	go run ./tools/catalogc freeze

.PHONY: verify
verify: ## Regenerate and fail if that changed or added any file
	$(MAKE) gen
	@status="$$(git status --porcelain)"; \
	if [[ -n "$$status" ]]; then \
		echo "verify: the tree differs from the commit after make gen:" >&2; \
		echo "$$status" >&2; \
		git --no-pager diff --stat >&2; \
		git --no-pager diff | head -n 200 >&2 || true; \
		exit 1; \
	fi

.PHONY: db
db: ## Start the dev PostgreSQL cluster (when SERVICE_DATABASE_URL is unset) and print its URL
	@if [[ -n "$${SERVICE_DATABASE_URL:-}" ]]; then \
		echo "SERVICE_DATABASE_URL is set: not starting the dev cluster" >&2; \
	else \
		$(DEVDB) start; \
	fi

.PHONY: stop
stop: ## Stop the dev PostgreSQL cluster
	@$(DEVDB) stop

$(SECRET_FILE):
	@mkdir -p $(@D)
	@umask 077; head -c 36 /dev/urandom | base64 | tr -d '\n' | tr '+/' '-_' >$@.tmp
	@mv $@.tmp $@

IMAGES_DIR ?= .service/images

.PHONY: images
images: ## Build the minimal guest image from the distribution's packages into IMAGES_DIR
	images/build.sh $(IMAGES_DIR)

# Rebuilt when the build script, the guest kernel's config or the guest
# agent changed (the kernel itself is cached by its config: images/build.sh).
$(IMAGES_DIR)/minimal.json: images/build.sh images/kernel/guest.config $(shell find cmd/compute-guest internal/guest internal/guestproto -name '*.go' -not -name '*_test.go')
	images/build.sh $(IMAGES_DIR)

.PHONY: run
run: $(SECRET_FILE) $(IMAGES_DIR)/minimal.json ## Run the service, every role, on PORT (default 3000), its gateway on GATEWAY_PORT (default 7443)
	@$(SERVICE_ENV); export SERVICE_CONFIG="$${SERVICE_CONFIG:-deploy/dev.yaml}"; \
		if [[ -n "$${GATEWAY_PORT:-}" ]]; then \
			export SERVICE_GATEWAY_LISTEN="127.0.0.1:$$GATEWAY_PORT" SERVICE_GATEWAY_URL="https://localhost:$$GATEWAY_PORT"; \
		fi; \
		go run ./cmd/computed pki init >/dev/null; exec go run ./cmd/computed

.PHONY: release
RELEASE_DIR ?= dist/downloads
release: $(SECRET_FILE) ## Build, checksum and sign every binary for linux/amd64 and linux/arm64 into RELEASE_DIR (default dist/downloads): make release [VERSION=v1.2.3]
	go run ./tools/release -out "$(RELEASE_DIR)" $(if $(VERSION),-version "$(VERSION)")

.PHONY: key
key: $(SECRET_FILE) ## Make an API key: make key TENANT=acme ROLE=owner [IDENTITY=ann]
	@test -n "$(TENANT)" -a -n "$(ROLE)" || { echo "usage: make key TENANT=<tenant> ROLE=owner|admin|member|viewer [IDENTITY=<id>]" >&2; exit 2; }
	@$(SERVICE_ENV); go run ./cmd/computed iam create-key --tenant "$(TENANT)" --identity "$${IDENTITY:-$(TENANT)-$(ROLE)}" --role "$(ROLE)"

# Tools the tests run, built from the Go module proxy into .service/bin:
# versitygw, a real S3-compatible server (internal/blob/blobtest pins the
# same version and builds it on demand when this was not run).
VERSITYGW ?= github.com/versity/versitygw/cmd/versitygw@v1.8.0
# spicedb, the relationship-based authorization server external decisions
# are tested against (internal/iam/spicedb/spicedbtest pins the same).
SPICEDB ?= github.com/authzed/spicedb/cmd/spicedb@v1.56.2

.PHONY: tools
tools: .service/bin/versitygw .service/bin/spicedb .service/bin/oidcprovider ## Build the servers tests run (versitygw, the S3 server; spicedb; an OIDC provider) into .service/bin

# TOOLS_CACHE (unset by default; .ci/run sets ~/.cache/computeplane/tools)
# keeps each built server outside the checkout by what it is built from
# (scripts/tool-cache.sh), so a machine that keeps it builds each once.
.service/bin/versitygw:
	scripts/tool-cache.sh $@ $(VERSITYGW) -- env GOBIN="$(CURDIR)/$(@D)" go install $(VERSITYGW)

.service/bin/spicedb:
	scripts/tool-cache.sh $@ $(SPICEDB) -- env GOBIN="$(CURDIR)/$(@D)" go install $(SPICEDB)

# oidcprovider, an OpenID Connect provider on github.com/zitadel/oidc/v3's op
# package (tools/oidcprovider, a module of its own). Its key is the hash
# internal/iam/oidc/oidctest computes of its sources, written beside it as
# the tests do, so that they take this binary rather than build it again.
OIDCPROVIDER_SRC := tools/oidcprovider/main.go tools/oidcprovider/go.mod tools/oidcprovider/go.sum
.service/bin/oidcprovider: $(OIDCPROVIDER_SRC)
	@key="$$(for f in $(OIDCPROVIDER_SRC); do printf '%s %d\n' "$${f##*/}" "$$(stat -c %s "$$f")"; cat "$$f"; done | sha256sum | cut -d' ' -f1)"; \
		scripts/tool-cache.sh $@ "$$key" -- go -C tools/oidcprovider build -o "$(CURDIR)/$@" . && \
		printf '%s' "$$key" >$(@D)/.oidcprovider.sources

.PHONY: test
# Tests that run real processes and VMs (and the kill test, which measures
# against deadlines) run after the others: on a 2-core machine their CPU
# load would otherwise share the clock of every timing-sensitive test.
# Their timeout is 30 minutes a package, not go test's 10: a VM package
# takes 2 to 4 minutes on a quiet 2-core machine and more than 10 on a
# loaded one.
PROCESS_TESTS = ./internal/killtest ./internal/shutdowntest ./internal/join ./internal/agent/telemetry ./cmd/computectl ./cmd/compute-agent ./internal/tunnels ./internal/agent/network ./internal/instances ./internal/reservations ./internal/sandboxvolumes ./internal/sandboxes ./internal/gateway ./internal/qemu ./internal/agent/vmruntime ./internal/workflows ./internal/drivers/qemudriver ./internal/provideraccounts ./internal/supportbundles ./internal/blob ./internal/downloads ./internal/deploytest ./internal/plugins ./internal/iam
# Of those, the ones that boot no VM, make no network namespace, bind no
# fixed port, assert no wall-clock bound and compute little (they wait on
# PostgreSQL and on their child processes) run two at a time (-p 2) before
# the others. The VM packages, the kill test and iam (its SpiceDB servers
# keep both cores busy: docs/benchmarks-notes.md, "CI wall time") stay one
# at a time.
PARALLEL_PROCESS_TESTS = ./internal/join ./internal/blob ./internal/downloads ./internal/plugins ./internal/gateway ./internal/deploytest
SERIAL_PROCESS_TESTS = $(filter-out $(PARALLEL_PROCESS_TESTS),$(PROCESS_TESTS))

# The guest image (and its kernel, from an empty cache) is built before
# go test, outside any package's timeout, as the tests would build it.
test: $(SECRET_FILE) ## Run every test against the dev cluster, then fuzz-short
	go run ./tools/guestimage
	@$(SERVICE_ENV); go test -count=1 $$(go list ./... | grep -v -F -x $(foreach p,$(PROCESS_TESTS),-e computeplane/$(patsubst ./%,%,$(p)))) && \
		go test -count=1 -p 2 -timeout 30m $(PARALLEL_PROCESS_TESTS) && \
		go test -count=1 -p 1 -timeout 30m $(SERIAL_PROCESS_TESTS)
	@$(MAKE) fuzz-short

.PHONY: fuzz-short
fuzz-short: $(SECRET_FILE) ## Fuzz each FUZZ_TARGETS entry for FUZZ_TIME (default 10s)
	@$(SERVICE_ENV); scripts/fuzz-short.sh $(FUZZ_TIME) $(FUZZ_TARGETS)

.PHONY: foreign-clients
foreign-clients: ## Generate and compile an oapi-codegen Go client and openapi-typescript types from openapi.yaml
	scripts/foreign-clients.sh

.PHONY: bench-sessions
bench-sessions: $(SECRET_FILE) ## Gateway benchmark: 10,000 daemon sessions, memory per session, reconnect time and the gateway's CPU per session, 3 runs, the gateway and the load tool pinned to separate cores (writes docs/benchmarks.md)
	@scripts/settle.sh
	@$(SERVICE_ENV); ulimit -n "$$(ulimit -Hn)"; go run ./tools/sessionload -n $${SESSIONS:-10000} -runs $${ROUNDS:-3}

.PHONY: bench-instances
bench-instances: $(SECRET_FILE) $(IMAGES_DIR)/minimal.json ## VM benchmark: instances.create to running over 100 real VMs (writes docs/benchmarks.md)
	@scripts/settle.sh
	@$(SERVICE_ENV); go run ./tools/instancebench -runs $${RUNS:-100} -images $(IMAGES_DIR)

.PHONY: bench-sandboxes
bench-sandboxes: $(SECRET_FILE) $(IMAGES_DIR)/minimal.json ## VM benchmark: sandboxes.create to running, warm claim, cold boot (and a bare qemu boot) and restore, 3 rounds of 100 of each (writes docs/benchmarks.md)
	@scripts/settle.sh
	@$(SERVICE_ENV); go run ./tools/sandboxbench -runs $${RUNS:-100} -rounds $${ROUNDS:-3} -images $(IMAGES_DIR)

.PHONY: bench-network
bench-network: $(SECRET_FILE) $(IMAGES_DIR)/minimal.json ## Network benchmark, as root: what egress adds to cold boot and warm claim, guest TCP throughput and connection rate (writes docs/benchmarks.md and docs/benchmarks-notes.md)
	@$(SERVICE_ENV); NETBENCH_OUT=$(CURDIR)/docs/benchmarks.md NETBENCH_NOTES=$(CURDIR)/docs/benchmarks-notes.md RUNS=$${RUNS:-20} go test -tags netbench -count=1 -v -timeout 120m -run TestNetworkBenchmark ./tools/netbench

.PHONY: bench-tunnels
bench-tunnels: $(SECRET_FILE) $(IMAGES_DIR)/minimal.json ## Tunnel benchmark: open latency, tcp tunnel throughput, gateway memory with 1,000 idle tunnels (writes docs/benchmarks.md and docs/benchmarks-notes.md)
	@$(SERVICE_ENV); TUNNELBENCH_OUT=$(CURDIR)/docs/benchmarks.md TUNNELBENCH_NOTES=$(CURDIR)/docs/benchmarks-notes.md go test -tags tunnelbench -count=1 -v -timeout 60m -run TestTunnelBenchmark ./internal/tunnels

.PHONY: bench
bench: $(SECRET_FILE) $(IMAGES_DIR)/minimal.json ## Load benchmark (API vs pgbench, the creates' round trips; writes docs/benchmarks.md), then go benchmarks
	@scripts/settle.sh
	NOTIFIER_BENCH=$${NOTIFIER_BENCH:-1} scripts/bench.sh
	@$(SERVICE_ENV); go test -run='^$$' -bench=. -benchtime=2s ./...

.PHONY: lint
lint: ## go vet, and golangci-lint when installed
	go vet ./...
	@if command -v golangci-lint >/dev/null; then \
		golangci-lint run ./...; \
	else \
		echo "lint: golangci-lint is not installed; ran go vet only" >&2; \
	fi

.PHONY: ci
ci: ## What CI runs: test, then verify
	$(MAKE) test
	$(MAKE) verify

.PHONY: clean
clean: ## Stop the dev cluster and delete .service/ (its data, secret and PKI) and build output
	@$(DEVDB) stop
	@if [[ -s .service/pg.base ]]; then \
		base="$$(cat .service/pg.base)"; \
		case "$$base" in /tmp/computeplane-devdb-*) rm -rf "$$base" ;; esac; \
	fi
	rm -rf .service bin dist
	go clean -testcache
