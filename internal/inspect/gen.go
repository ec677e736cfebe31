package inspect

// The BPF object is generated and committed, so go build needs no clang.
// To regenerate (Debian: apt-get install clang llvm libbpf-dev, which
// scripts/deps.sh installs):
//
//	go generate ./internal/inspect/
//
// The output is reproducible (Debian 12's clang 14: the same bytes from
// any checkout path). `make lint` generates it into $MOLT_BPF2GO_OUT and
// fails if it differs from the committed files; unset, the files are
// written here.

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -output-dir "$MOLT_BPF2GO_OUT" -target amd64 -type ev_hdr -type watch_val inspect bpf/inspect.bpf.c -- -I/usr/include/x86_64-linux-gnu -D__TARGET_ARCH_x86 -Wall -Werror
