#!/usr/bin/env bash
# Installs what molt needs on a Debian 12 host, idempotently: btrfs-progs
# (mkfs.btrfs for the loop pool), debootstrap (images), musl-tools (to
# check that internal/pid1/pid1.bin is built from its source), clang-14,
# llvm-14, libbpf-dev and linux-libc-dev (to check that internal/inspect's
# BPF object is generated from its source; clang 14 because another
# version emits other bytes), python3 (the test processes of
# internal/template), python3-pip (a real pip install from the test
# internet, internal/egress/netlab), chromium (internal/webui's test
# drives the web view in headless Chromium), and Node.js 18 or newer with
# npm (the TypeScript SDK, sdk/ts: its tests run on node, `make lint`
# type-checks it with TypeScript from npm; a node already on PATH,
# Debian's or another, is kept). Needs root.
set -euo pipefail

need=()
for pkg in btrfs-progs debootstrap ca-certificates musl-tools clang-14 llvm-14 libbpf-dev linux-libc-dev python3 python3-pip chromium; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
# Node.js: Debian 12's nodejs is 18; npm is its own package there (a
# NodeSource nodejs brings npm along, and conflicts with Debian's).
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if ((${#need[@]})); then
	if [[ $EUID -ne 0 ]]; then
		echo "deps: need root to install ${need[*]}" >&2
		exit 1
	fi
	echo "deps: installing ${need[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1; then
	if [[ -x /usr/local/go/bin/go ]]; then
		echo "deps: go is at /usr/local/go/bin; add it to PATH" >&2
	else
		echo "deps: Go 1.26 or newer is required (https://go.dev/dl/)" >&2
	fi
	exit 1
fi

node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if ((node_major < 18)); then
	echo "deps: Node.js 18 or newer is required (sdk/ts), found $(node --version 2>/dev/null || echo none)" >&2
	exit 1
fi
