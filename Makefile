# molt: the two commands of the README are `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all deps build demo test lint bench-fs clean

all: build

deps:
	@scripts/deps.sh
	@scripts/criu.sh >/dev/null

build: deps
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/molt ./cmd/molt

# Runs a scripted agent session on a temporary root and cleans up.
demo: build
	bin/molt demo

# Root tests never skip here: a missing capability fails the run.
# Packages run one at a time: they share the debootstrap cache and the
# machine's two cores. The concurrent core runs again under the race
# detector.
test: build lint
	MOLT_REQUIRE_PRIVILEGED=1 $(GO) test -p 1 -count=1 -timeout 30m ./...
	MOLT_REQUIRE_PRIVILEGED=1 $(GO) test -race -p 1 -count=1 -timeout 20m ./api/... ./client ./internal/core ./internal/sbinit ./internal/pagestore ./internal/revert ./internal/sched ./internal/llmproxy ./internal/coord ./internal/inspect ./internal/ns ./internal/pid1 ./internal/template

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting" >&2; exit 1; }
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	@# pid1.bin is committed (so go build needs no C toolchain) and must be
	@# what its source builds to (the build is reproducible).
	@tmp=$$(mktemp) && musl-gcc -static -Os -s -Wall -Wextra -Werror -o $$tmp internal/pid1/csrc/pid1.c && \
		if ! cmp -s $$tmp internal/pid1/pid1.bin; then rm -f $$tmp; echo "internal/pid1/pid1.bin is not built from csrc/pid1.c: run go generate ./internal/pid1" >&2; exit 1; fi; rm -f $$tmp

bench-fs: build
	bin/molt bench fs

clean:
	rm -rf bin
