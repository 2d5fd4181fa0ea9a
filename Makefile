# csiactor — see README.md. Every target works from a clean clone.
GO      ?= go
PKGS    ?= ./...
BIN     := bin/csiactor
TESTFLAGS ?= -race -count=1 -timeout 12m
# bench: one package at a time (-p 1: benchmarks of two packages running at
# once on a small machine would measure each other). Every benchmark runs
# time-based, BENCHTIME per benchmark (Go picks the iteration count: micro
# benchmarks get thousands, a lifecycle about a thousand, an op that takes
# a second runs once). Heavy set-up (the 100k-volume stores) is done once
# per benchmark, outside the timed sub-benchmarks. Benchmarks whose timed
# part is short but whose untimed part is long get a fixed count instead:
#   BenchmarkHeartbeat      one op is a one-second window; 3 windows
#   BenchmarkDeathDetection each op waits for a plugin restart untimed; 200 kills
#   BenchmarkLifecycleRealPlugin a lifecycle takes 10-250 ms (synced store,
#                           real plugin, a CPU hog beside the loaded ones)
#                           and an untimed bare one runs beside each: 50
#                           pairs per sub-benchmark, the same sample in
#                           every run, 5-25 s each
#   BenchmarkScale          N agents on a 3-member embedded etcd, once per
#                           N (1x); small by default (3 agents, 1,000
#                           volumes, 200 claims, about 20 s); the campaign
#                           is set by CSIACTOR_SCALE_AGENTS (e.g. 3,10,30,100),
#                           CSIACTOR_SCALE_VOLUMES (10000) and
#                           CSIACTOR_SCALE_CLAIMS (see cluster/scale_test.go)
# The whole run takes about 3 minutes on 2 cores.
BENCHTIME ?= 1s
BENCHFLAGS ?= -run '^$$' -benchmem -timeout 30m

.PHONY: all build run run-cluster test bench lint fmt clean deb

all: build

# VERSION and REVISION are what `csiactor version` and csiactor_build_info
# report: the nearest tag, commits since and the commit (git describe),
# "-dirty" with uncommitted changes; and the commit.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null)
REVISION ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)

build:
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.revision=$(REVISION)" -o $(BIN) ./cmd/csiactor

## deb: the Debian package $(DEB_OUT)/csiactor_<version>_<arch>.deb (nfpm, pinned as a go tool in go.mod).
# The binary is static (CGO_ENABLED=0: the package depends on nothing) and
# built with -trimpath; the shell completions come from it (from a build
# for this host when cross-building: make deb GOARCH=arm64); every file's
# mtime is the last commit's time (SOURCE_DATE_EPOCH). The package version
# is VERSION made a Debian one (packaging/debversion.sh), its architecture
# GOARCH in Debian's names (nfpm maps them). packaging/nfpm.yaml lists the
# contents; packaging/deb holds the maintainer scripts.
comma       := ,
DEB_OUT     ?= bin
DEB_STAGE   ?= bin/deb
DEB_GOARCH   = $(or $(GOARCH),$(shell $(GO) env GOARCH))
DEB_ARCH    ?= $(if $(filter arm,$(DEB_GOARCH)),arm$(firstword $(subst $(comma), ,$(or $(GOARM),$(shell $(GO) env GOARM)))),$(DEB_GOARCH))
DEB_VERSION ?= $(shell packaging/debversion.sh '$(VERSION)')
# Tools run on this host whatever GOOS, GOARCH and GOARM say.
DEB_HOSTGO   = GOOS= GOARCH= GOARM= $(GO)
DEB_COMPLETE = $(if $(filter $(DEB_GOARCH),$(shell $(GO) env GOHOSTARCH)),$(DEB_STAGE)/csiactor,$(DEB_HOSTGO) run ./cmd/csiactor)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)

deb:
	@test -n "$(DEB_VERSION)" || { echo "make deb: VERSION '$(VERSION)' gives no package version" >&2; exit 1; }
	rm -rf $(DEB_STAGE) && mkdir -p $(DEB_STAGE) $(DEB_OUT)
	GOOS=linux CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.version=$(VERSION) -X main.revision=$(REVISION)" -o $(DEB_STAGE)/csiactor ./cmd/csiactor
	$(DEB_COMPLETE) completion bash >$(DEB_STAGE)/csiactor.bash
	$(DEB_COMPLETE) completion zsh >$(DEB_STAGE)/_csiactor
	$(DEB_COMPLETE) completion fish >$(DEB_STAGE)/csiactor.fish
	DEB_STAGE=$(DEB_STAGE) DEB_VERSION=$(DEB_VERSION) DEB_ARCH=$(DEB_ARCH) SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) \
		$(DEB_HOSTGO) tool nfpm package -f packaging/nfpm.yaml -p deb -t $(DEB_OUT)/

## run: start the agent on its embedded default (a temp data dir and the example plugin).
run: build
	./$(BIN) agent -dev

## run-cluster: an embedded etcd and three agents (each with the example plugin, on shared storage) sharing it; Ctrl-C stops all.
# Built and run rather than `go run`: go run exits 1 after a Ctrl-C even
# when the program exits 0, and make would report an error.
run-cluster: build
	$(GO) build -o bin/csiactor-cluster ./examples/cluster
	./bin/csiactor-cluster -bin $(BIN)

# The kubernetes-csi hostpath driver, which the lifecycle, crash, repair and
# cluster tests run against beside our own plugins: $CSIACTOR_HOSTPATH_PLUGIN,
# else a build beside the repository (../shared/bin, as CI has it); the
# tests that need it skip with a message where there is none.
CSIACTOR_HOSTPATH_PLUGIN ?= $(abspath $(wildcard ../shared/bin/hostpathplugin))
export CSIACTOR_HOSTPATH_PLUGIN

# The real Docker and Podman engines (Debian's docker.io, podman and
# busybox-static), which the volume plugin's tests run: on where we are
# root and all four binaries are installed, as CI has it; elsewhere unset,
# and those tests skip with a message.
ENGINE_BINS := /usr/sbin/dockerd /usr/bin/docker /usr/bin/podman /usr/bin/busybox
CSIACTOR_TEST_ENGINES ?= $(if $(and $(filter 0,$(shell id -u)),$(filter $(words $(ENGINE_BINS)),$(words $(wildcard $(ENGINE_BINS))))),1)
export CSIACTOR_TEST_ENGINES

## test: vet, then every test with the race detector (root-only tests skip elsewhere).
# The end-to-end package (test/e2e) takes longest by far and mostly waits on
# processes, mounts and engines: with the default PKGS it starts at once,
# beside the other packages, instead of last (go test runs packages in
# order, GOMAXPROCS at a time), with a longer timeout, and in two processes
# at once, of about the same length: the tests of plugins in containers
# (each with its own private engines) and of FUSE mounts (E2E_SET1), and
# the others. All three runs must pass.
E2E := ./test/e2e
E2E_SET1 := ^Test(Image|Docker|Podman)_|FUSE
test:
	$(GO) vet $(PKGS)
ifeq ($(PKGS),./...)
	@$(GO) test $(TESTFLAGS) -timeout 25m -run '$(E2E_SET1)' $(E2E) & set1=$$!; \
	$(GO) test $(TESTFLAGS) -timeout 25m -skip '$(E2E_SET1)' $(E2E) & e2e=$$!; \
	$(GO) test $(TESTFLAGS) $$($(GO) list ./... | grep -vx '$(shell $(GO) list $(E2E))'); rest=$$?; \
	wait $$set1; set1=$$?; wait $$e2e; e2e=$$?; \
	[ $$rest -eq 0 ] && [ $$set1 -eq 0 ] && [ $$e2e -eq 0 ] || { echo "make test: FAIL (other packages: exit $$rest, $(E2E) containers and FUSE: exit $$set1, $(E2E) others: exit $$e2e)" >&2; exit 1; }
else
	$(GO) test $(TESTFLAGS) $(PKGS)
endif

## bench: every benchmark, each next to its baseline in the same run.
bench:
	$(GO) test -p 1 $(BENCHFLAGS) -bench . -benchtime $(BENCHTIME) \
		-skip '^(BenchmarkHeartbeat|BenchmarkDeathDetection|BenchmarkLifecycleRealPlugin|BenchmarkScale)$$' $(PKGS)
	$(GO) test -p 1 $(BENCHFLAGS) -bench '^BenchmarkHeartbeat$$' -benchtime 3x $(PKGS)
	$(GO) test -p 1 $(BENCHFLAGS) -bench '^BenchmarkDeathDetection$$' -benchtime 200x $(PKGS)
	$(GO) test -p 1 $(BENCHFLAGS) -bench '^BenchmarkLifecycleRealPlugin$$' -benchtime 50x $(PKGS)
	$(GO) test -p 1 $(BENCHFLAGS) -bench '^BenchmarkScale$$' -benchtime 1x $(PKGS)

## lint: go vet and staticcheck (pinned as a go tool in go.mod).
lint:
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)

fmt:
	gofmt -s -w $$(git ls-files '*.go')

clean:
	rm -rf bin
