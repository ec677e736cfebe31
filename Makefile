# molt: the two commands of the README are `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
PYTHON ?= python3
NODE ?= node
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# gVisor's lock analyzer: fields annotated +checklocks:MU are only
# touched with MU held (internal/core/doc.go, "Locks").
CHECKLOCKS := gvisor.dev/gvisor/tools/checklocks/cmd/checklocks@v0.0.0-20260905035102-160fafc42237

.PHONY: all deps build generate demo test test-python test-ts lint lint-bpf fuzz race-core bench-fs clean

all: build

# The S3 server of the tests (versitygw) is built from the Go module
# proxy once, into /var/cache/molt/s3 (docs/storage.md); so are the
# kube-apiserver and etcd of the Kubernetes tests, into
# /var/cache/molt/kube (docs/kubernetes.md, "Tests").
deps:
	@scripts/deps.sh
	@scripts/criu.sh >/dev/null
	@scripts/s3server.sh >/dev/null
	@scripts/kube-assets.sh >/dev/null

build: deps
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/molt ./cmd/molt

# The Kubernetes API's deep copies and CRDs (api/kube, deploy/kubernetes/crd),
# made by controller-gen, pinned in tools/codegen. `make lint` checks
# that the committed files are what it makes.
CONTROLLER_GEN = cd tools/codegen && $(GO) tool controller-gen
generate:
	$(CONTROLLER_GEN) object paths=../../api/kube/... crd:maxDescLen=400 output:crd:artifacts:config=../../deploy/kubernetes/crd

# Runs a scripted agent session on a temporary root and cleans up.
demo: build
	bin/molt demo

# Root tests never skip here: a missing capability fails the run.
# Packages run one at a time: they share the debootstrap cache and the
# machine's two cores. The concurrent packages run again under the race
# detector; internal/core is out of that pass until the template
# capture's rare loss of pid1's copy before its dump (docs/testing.md,
# "Known flaky") is fixed: the race detector's slowdown makes it likely.
# `make race-core` runs it.
test: build lint
	MOLT_REQUIRE_PRIVILEGED=1 GO=$(GO) scripts/gotest.sh -p 1 -count=1 -timeout 30m ./...
	MOLT_REQUIRE_PRIVILEGED=1 GO=$(GO) scripts/gotest.sh -race -p 1 -count=1 -timeout 30m ./api/... ./client ./internal/sbinit ./internal/pagestore ./internal/revert ./internal/sched ./internal/llmproxy ./internal/coord ./internal/inspect ./internal/turn ./internal/ns ./internal/pid1 ./internal/template ./internal/kube
	MOLT_REQUIRE_PRIVILEGED=1 $(PYTHON) sdk/python/tests/live.py --molt bin/molt
	MOLT_REQUIRE_PRIVILEGED=1 $(NODE) sdk/ts/test/live.mjs --molt bin/molt

# The Python SDK (sdk/python): compiled, installed with pip from the
# directory (no index), and tested with unittest against a daemon of its
# own on a temporary root (sdk/python/tests/live.py; docs/testing.md,
# "Python SDK"). Skipped without root, except under `make test`.
test-python: build
	$(PYTHON) sdk/python/tests/live.py --molt bin/molt

# The TypeScript SDK (sdk/ts): JavaScript modules with hand-written
# declarations, no runtime dependencies, tested with `node --test`
# against a daemon of its own on a temporary root, with its LangGraph.js
# saver (sdk/ts/langgraph, `npm ci` first) (sdk/ts/test/live.mjs;
# docs/testing.md, "TypeScript SDK"). Only the unit tests without root,
# except under `make test`.
test-ts: build
	$(NODE) sdk/ts/test/live.mjs --molt bin/molt

# The seed corpora (testdata/fuzz, every input that ever failed among
# them) run in `make test` with the other tests. The exploration below is
# random, so it is not part of the gate: a run that passes on one machine
# could fail on the next for an input no change brought. .ci/run runs it
# after the gate and prints what it finds (docs/testing.md, "Fuzzing").
#
# A short run of every fuzz target, one at a time (-fuzz takes one package
# and one target), about 5 s each here. Entries are PACKAGE:Target:BUDGET;
# the budgets are execution counts, not durations: with a duration, Go
# 1.26's coordinator can report a spurious "context deadline exceeded" at
# the deadline on a loaded machine (go.dev/issue/75804). The seed corpora
# are in each package's testdata/fuzz; a failing input is written there
# and, once fixed, stays as a seed. FUZZTIME=10m runs every target for
# that long; FUZZ_TARGETS=./internal/image:FuzzImportTar: runs one
# (docs/testing.md).
FUZZTIME ?=
FUZZ_ALL := ./api/v1:FuzzReadFrame:20000x ./api/v1:FuzzValidEnv:100000x \
	./internal/httpapi:FuzzDecodeBody:20000x ./internal/criu:FuzzMergeImages:3000x \
	./internal/image:FuzzImportTar:300x ./internal/image:FuzzUnpackLayers:300x ./internal/ckstore:FuzzDecodeManifest:20000x \
	./internal/seccomp:FuzzParseOCI:100000x ./internal/egress:FuzzClientHello:100000x \
	./internal/egress/ledger:FuzzLedgerFile:3000x ./internal/audit:FuzzVerify:5000x \
	./internal/criu:FuzzValidateImages:3000x ./internal/bundle:FuzzRead:2000x \
	./internal/remote:FuzzDecodeRecipe:3000x
FUZZ_TARGETS ?= $(FUZZ_ALL)
fuzz:
	@# Every fuzz target of the repository is in the list.
	@for f in $$(git grep -hoE '^func Fuzz[A-Za-z0-9_]+' -- '*_test.go' | sed 's/^func //'); do \
		case " $(FUZZ_ALL) " in *":$$f:"*) ;; *) echo "fuzz: $$f is not in FUZZ_ALL" >&2; exit 1;; esac; done
	@set -eo pipefail; for t in $(FUZZ_TARGETS); do \
		IFS=: read -r pkg fn budget <<< "$$t"; budget=$${FUZZTIME:-$$budget}; \
		echo "fuzz $$pkg $$fn for $$budget"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime "$$budget" -timeout 0 "$$pkg" | grep -v '^fuzz: elapsed:' || exit 1; \
	done

lint: lint-bpf
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting" >&2; exit 1; }
	$(GO) vet ./...
	@# The Python SDK compiles (its tests run in `make test`).
	$(PYTHON) sdk/python/tests/live.py --compile-only
	@# The TypeScript SDK type-checks: its JavaScript against its JSDoc and
	@# declarations, and test/types.ts against the declarations (TypeScript
	@# from sdk/ts/package-lock.json; its tests run in `make test`).
	cd sdk/ts && npm ci --no-audit --no-fund --loglevel=error && node_modules/.bin/tsc -p tsconfig.json
	cd sdk/ts/langgraph && npm ci --no-audit --no-fund --loglevel=error && node_modules/.bin/tsc -p tsconfig.json
	$(GO) run $(STATICCHECK) ./...
	@# -wrappers=false: the analyzer reports the compiler's wrapper
	@# functions at no position, where no annotation can answer it.
	$(GO) run $(CHECKLOCKS) -test=false -wrappers=false ./...
	@# The generated Kubernetes files are current.
	@tmp=$$(mktemp -d) && cp -r deploy/kubernetes/crd api/kube/v1alpha1/zz_generated.deepcopy.go $$tmp/ && $(MAKE) -s generate && \
		if ! diff -r $$tmp/crd deploy/kubernetes/crd || ! cmp $$tmp/zz_generated.deepcopy.go api/kube/v1alpha1/zz_generated.deepcopy.go; then \
		rm -rf $$tmp; echo "api/kube or deploy/kubernetes/crd were not what controller-gen makes (now they are: commit them)" >&2; exit 1; fi; rm -rf $$tmp
	@# No production file over 800 lines, no function over 120.
	$(GO) run ./internal/tools/sizes
	@# pid1.bin is committed (so go build needs no C toolchain) and must be
	@# what its source builds to (the build is reproducible).
	@tmp=$$(mktemp) && musl-gcc -static -Os -s -Wall -Wextra -Werror -o $$tmp internal/pid1/csrc/pid1.c && \
		if ! cmp -s $$tmp internal/pid1/pid1.bin; then rm -f $$tmp; echo "internal/pid1/pid1.bin is not built from csrc/pid1.c: run go generate ./internal/pid1" >&2; exit 1; fi; rm -f $$tmp

# internal/inspect's BPF object and its Go binding are committed too, and
# must be what bpf2go makes of bpf/ (reproducible with Debian 12's clang
# 14; another clang emits other bytes).
lint-bpf:
	@tmp=$$(mktemp -d) && \
		if ! MOLT_BPF2GO_OUT=$$tmp BPF2GO_CC=clang-14 BPF2GO_STRIP=llvm-strip-14 $(GO) generate ./internal/inspect; then rm -rf $$tmp; echo "bpf2go failed (scripts/deps.sh installs clang-14)" >&2; exit 1; fi; \
		for f in inspect_x86_bpfel.o inspect_x86_bpfel.go; do \
			if ! cmp -s $$tmp/$$f internal/inspect/$$f; then rm -rf $$tmp; echo "internal/inspect/$$f is not generated from bpf/: run go generate ./internal/inspect" >&2; exit 1; fi; \
		done; \
		if [ "$$(ls $$tmp | wc -l)" != 2 ]; then ls $$tmp >&2; rm -rf $$tmp; echo "bpf2go generated other files than the two committed" >&2; exit 1; fi; rm -rf $$tmp

race-core: build
	MOLT_REQUIRE_PRIVILEGED=1 $(GO) test -race -p 1 -count=1 -timeout 30m -skip '^TestProcessStateConformance$$' ./internal/core

bench-fs: build
	bin/molt bench fs

clean:
	rm -rf bin
