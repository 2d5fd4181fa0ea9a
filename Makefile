# csiactor — see README.md. Every target works from a clean clone.
GO      ?= go
PKGS    ?= ./...
BIN     := bin/csiactor
TESTFLAGS ?= -race -count=1 -timeout 12m
BENCHFLAGS ?= -run '^$$' -bench . -benchmem -benchtime 1x

.PHONY: all build run test bench lint fmt clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/csiactor

## run: start the agent on its embedded default (a temp data dir and the example plugin).
run: build
	./$(BIN) agent -dev

## test: vet, then every test with the race detector (root-only tests skip elsewhere).
test:
	$(GO) vet $(PKGS)
	$(GO) test $(TESTFLAGS) $(PKGS)

## bench: every benchmark, each next to its baseline in the same run.
bench:
	$(GO) test $(BENCHFLAGS) $(PKGS)

## lint: go vet and staticcheck (pinned as a go tool in go.mod).
lint:
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)

fmt:
	gofmt -s -w $$(git ls-files '*.go')

clean:
	rm -rf bin
