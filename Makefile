# Bulwark: build, run and test.
#
#   make run    install Postgres if missing, build, serve on the managed Postgres
#   make test   install Postgres if missing, go vet, go test -race
#   make test-short  the quick edit-test loop: go test -short, no -race
#   make tidy-check  fail when go.mod or go.sum differ from what go mod tidy writes
#
# Settings for `make run` come from the environment (BULWARK_*), or pass
# flags: make run ARGS="--listen 127.0.0.1:2600".

GO      ?= go
BIN     ?= bin/bulwark
ARGS    ?=
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

# apt-get needs root: use sudo when we are not root.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT  := env DEBIAN_FRONTEND=noninteractive apt-get

.PHONY: all run run-note test test-short build deps vet tidy-check clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/bulwark

# Under root, Postgres runs as the postgres user, which must be able to reach
# the data directory. A checkout under /root (mode 0700) is out of its reach,
# so run then keeps its data in /var/lib/bulwark instead, and says so.
run: deps run-note build
	@if [ -z "$$BULWARK_DATA_DIR" ] && [ "$$(id -u)" = 0 ] && id postgres >/dev/null 2>&1 && \
		! runuser -u postgres -- test -x "$(CURDIR)" 2>/dev/null; then \
		echo "make run: $(CURDIR) is not reachable by the postgres user; using BULWARK_DATA_DIR=/var/lib/bulwark"; \
		mkdir -p -m 0711 /var/lib/bulwark; \
		export BULWARK_DATA_DIR=/var/lib/bulwark; \
	fi; \
	exec ./$(BIN) serve $(ARGS)

# The first build downloads and compiles every dependency: say so, so that a
# silent terminal is not taken for a hang.
run-note:
	@[ -x "$(BIN)" ] || echo "make run: building bulwark; the first build downloads and compiles its dependencies and takes a few minutes"

vet:
	$(GO) vet ./...

# test-short is for the edit-test loop, not for CI (CI runs make test): no
# -race, and -short skips the slow tests: indigo's relay resuming after a
# repair (firehose/relaytest, waits out the relay's redial back-off), the
# serve lifecycle, the sweep of every XRPC method through serve and the
# console through serve in Chromium (cmd/bulwark, build the binary and run
# a managed Postgres), the
# crash test (repo, kills a writer subprocess) and the load smoke tests
# (cmd/bulwark-load, timed runs, one in a child process); the concurrent
# writer tests (repo) and the rate limiter's memory bound (ratelimit) run
# with fewer writes and keys. Results of unchanged packages come from Go's
# test cache.
test-short: deps
	$(GO) test -short ./...

# tidy-check prints what `go mod tidy` would change in go.mod or go.sum and
# fails when that is anything; it changes nothing itself. Fix with go mod tidy.
tidy-check:
	$(GO) mod tidy -diff

# firehose/relaytest runs indigo's relay in the test process, and that
# relay writes a subscription's scheduler while its cursor saver reads it
# (cmd/relay/relay/slurper.go: handleConnection vs persistCursors), a data
# race of its own that -race reports whenever a reconnection meets a save.
# That package runs without -race; Bulwark's code it drives is race-tested
# by the other packages.
RACE_PKGS = $(shell $(GO) list ./... | grep -v '/firehose/relaytest$$')

test: deps
	$(GO) vet ./...
	$(GO) test -race -timeout 40m $(RACE_PKGS)
	$(GO) test -timeout 20m ./firehose/relaytest

# deps installs what building and testing need from the OS packages:
# PostgreSQL (server binaries: initdb, postgres) when none is found in PATH
# or /usr/lib/postgresql/*/bin, and a C compiler when there is none, because
# the race detector needs cgo. Go itself is a prerequisite (see README).
deps:
	@need=""; \
	if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		need="$$need postgresql"; \
	fi; \
	if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then \
		need="$$need gcc libc6-dev"; \
	fi; \
	if [ -n "$$need" ]; then \
		echo "installing from apt:$$need"; \
		$(SUDO) $(APT) update && $(SUDO) $(APT) install -y --no-install-recommends $$need; \
	fi

clean:
	rm -rf bin
