# Disker's tasks. `make` (or `make help`) lists them.

GO            ?= go
STATICCHECK   := honnef.co/go/tools/cmd/staticcheck@v0.8.2
BIN           := $(CURDIR)/bin
FUZZTIME      ?= 30s

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: demo
demo: ## Run the demo on the embedded in-memory broker (no setup needed).
	cd cmd/disker && $(GO) run . demo

.PHONY: demo-pool
demo-pool: ## Run the in-process pool demo (one worker versus a pool of three).
	cd cmd/disker && $(GO) run . demo pool

# deps also installs what the bench's peers need: node and npm (BullMQ),
# PostgreSQL's binaries (River; the bench runs a private server of its own,
# never the machine's), and BullMQ's node modules, pinned by
# bench/bullmq/package-lock.json, into the user's cache directory.
.PHONY: deps
deps: ## Install what the tests and the bench's peers need when it is missing (redis-server, curl, jq, chromium, node, npm, PostgreSQL; BullMQ's node modules).
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v curl >/dev/null 2>&1 || missing="$$missing curl"; \
	command -v jq >/dev/null 2>&1 || missing="$$missing jq"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v node >/dev/null 2>&1 || missing="$$missing nodejs"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@cd bench && $(GO) run ./cmd/bench -install-peers

# test runs one package's test binary at a time (-p 1): the root package's and
# the command's tests each run Redis servers, a Cluster and worker processes in
# parallel, and two such binaries at once starve each other on 2 cores. The
# tests of 10,000 receivers and senders run without -race (tenk_test.go): the
# race detector allows 8,128 live goroutines. The allocation tests run
# without -race too: the race detector drops what sync.Pool keeps, so they
# skip under it.
.PHONY: test
test: deps ## Run every test with the race detector (tests start their own private redis-server).
	$(GO) test -race -count=1 -p 1 -timeout 20m ./...
	$(GO) test -count=1 -run 'TestTenThousand' -timeout 15m .
	$(GO) test -count=1 -run 'Allocations|AllocateNothing' -timeout 5m . ./internal/redisbroker
	cd diskerprom && $(GO) test -race -count=1 -timeout 10m ./...
	cd internal/cli && $(GO) test -race -count=1 -p 1 -timeout 10m ./...
	cd cmd/disker && $(GO) test -race -count=1 -timeout 20m ./...
	cd bench && $(GO) test -count=1 -timeout 10m ./...
	cd browsertest && $(GO) test -count=1 -timeout 15m ./...
	cd diskerotel && $(GO) test -race -count=1 -timeout 10m ./...

.PHONY: test-short
test-short: deps ## The fast inner loop: skips stress, failure-injection, Sentinel and Cluster tests.
	$(GO) test -short -count=1 -timeout 5m ./...
	cd diskerprom && $(GO) test -short -count=1 -timeout 5m ./...
	cd internal/cli && $(GO) test -short -count=1 -timeout 5m ./...
	cd cmd/disker && $(GO) test -short -count=1 -timeout 5m ./...

.PHONY: lint
lint: apicheck tidy-check core-deps ## go vet, staticcheck (pinned; installed into ./bin), apicheck, tidy-check and core-deps.
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	cd diskerotel && $(GO) vet ./...
	cd browsertest && $(GO) vet ./...
	cd diskerprom && $(GO) vet ./...
	cd internal/cli && $(GO) vet ./...
	cd cmd/disker && $(GO) vet ./...
	GOBIN=$(BIN) $(GO) install $(STATICCHECK)
	$(BIN)/staticcheck ./...
	cd bench && $(BIN)/staticcheck ./...
	cd diskerotel && $(BIN)/staticcheck ./...
	cd browsertest && $(BIN)/staticcheck ./...
	cd diskerprom && $(BIN)/staticcheck ./...
	cd internal/cli && $(BIN)/staticcheck ./...
	cd cmd/disker && $(BIN)/staticcheck ./...

# tidy-check runs go mod tidy -diff in every directory with a go.mod (the
# core at the root and the modules nested in it) and fails on any change.
.PHONY: tidy-check
tidy-check: ## Fail if go mod tidy would change the go.mod or go.sum of any module of the repository.
	@for m in $$(find . -name go.mod -not -path './.git/*' -exec dirname {} \; | sort); do \
	  echo "go mod tidy -diff in $$m"; \
	  (cd $$m && $(GO) mod tidy -diff) || { echo "tidy-check: run go mod tidy in $$m"; exit 1; }; \
	done

# What only the command (internal/cli) and the Prometheus collector
# (diskerprom) need, each in a module of its own; the core must not require it.
CORE_FORBIDDEN := github\.com/spf13/(cobra|pflag)|golang\.org/x/term|github\.com/prometheus/

.PHONY: core-deps
core-deps: ## Fail if the core module's go.mod requires cobra, pflag, x/term or Prometheus.
	@bad=$$($(GO) mod edit -json | grep -o '"Path": "[^"]*"' | cut -d '"' -f 4 | grep -E '^($(CORE_FORBIDDEN))'); \
	if [ -n "$$bad" ]; then echo "core-deps: go.mod requires what only the command or diskerprom needs:" $$bad; exit 1; fi

API_PKGS := . ./pool ./diskertest

.PHONY: apicheck
apicheck: ## Fail if the exported API of disker, pool and diskertest differs from the snapshot in api/.
	$(GO) build -o $(BIN)/apicheck ./internal/apicheck
	$(BIN)/apicheck -dir api -check $(API_PKGS)

.PHONY: api
api: ## Regenerate api/ (an incompatible change must be named in CHANGELOG.md's Unreleased).
	$(GO) build -o $(BIN)/apicheck ./internal/apicheck
	$(BIN)/apicheck -dir api -write $(API_PKGS)

.PHONY: fuzz
fuzz: ## Fuzz the decoders of data read from Redis and the network, FUZZTIME each.
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME) ./internal/wire/
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME) ./internal/httpmsg/
	$(GO) test -run '^$$' -fuzz FuzzDecodeSchedule -fuzztime $(FUZZTIME) .

.PHONY: bench
bench: deps ## Run Disker and its peers side by side (see BENCHMARKS.md); takes several minutes.
	cd bench && $(GO) run ./cmd/bench -suite all -runs 5

OLD        ?=
NEW        ?= HEAD
TURNS      ?= 3
BENCH_ARGS ?= -suite disker -runs 1

# bench-compare builds the harness of OLD and of NEW from git worktrees in a
# temporary directory and runs them in turns in one sitting (TURNS each,
# the first of a turn alternating), printing each figure's ratio new/old.
.PHONY: bench-compare
bench-compare: deps ## Measure OLD=<commit> against NEW (default HEAD) in one sitting: TURNS=3, BENCH_ARGS='-suite disker -runs 1'.
	@test -n "$(OLD)" || { echo "usage: make bench-compare OLD=<commit> [NEW=<commit>] [TURNS=3] [BENCH_ARGS='-suite disker -runs 1']"; exit 2; }
	cd bench && $(GO) run ./cmd/benchcompare -old $(OLD) -new $(NEW) -turns $(TURNS) -- $(BENCH_ARGS)

.PHONY: build
build: ## Build the disker command into ./bin.
	cd cmd/disker && $(GO) build -o $(BIN)/disker .

.PHONY: build-otel
build-otel: ## Build the disker command with OpenTelemetry tracing into ./bin/disker-otel.
	cd diskerotel && $(GO) build -o $(BIN)/disker-otel ./cmd/disker

CHAOS_TOPOLOGY ?= standalone
CHAOS_DURATION ?= 10m
CHAOS_SEED     ?=

.PHONY: chaos
chaos: deps ## Fault-injection run (RELIABILITY.md); CHAOS_TOPOLOGY, CHAOS_DURATION, CHAOS_SEED (default: random).
	$(GO) build -o $(BIN)/chaos ./internal/chaos/cmd/chaos
	$(BIN)/chaos -topology $(CHAOS_TOPOLOGY) -duration $(CHAOS_DURATION) $(if $(CHAOS_SEED),-seed $(CHAOS_SEED))

.PHONY: chaos-ci
chaos-ci: ## CI's short fault-injection run: 60 s on standalone Redis, seed 1; fails if an invariant breaks.
	$(MAKE) chaos CHAOS_TOPOLOGY=standalone CHAOS_DURATION=60s CHAOS_SEED=1

# chaos-mutants tests the checker: each planted bug of internal/chaos/mutants.go
# goes into a scratch copy of the files git tracks (their working-tree
# state), whose harness runs 30 s of faults; the checker must catch it. A
# bug whose text is no longer in the code fails it (update the mutant).
.PHONY: chaos-mutants
chaos-mutants: deps ## Test the fault-injection checker with planted bugs: each in a scratch copy, 30 s of faults (seed 1); fails unless every bug is caught.
	$(GO) run ./internal/chaos/cmd/chaosmutants -duration 30s -seed 1 -settle 15s
