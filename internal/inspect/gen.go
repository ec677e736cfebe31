package inspect

// The BPF object is generated and committed (CI has no clang). To regenerate
// (Debian/Ubuntu: apt-get install clang llvm libbpf-dev):
//
//	go generate ./internal/inspect/

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target amd64 -type ev_hdr -type watch_val inspect bpf/inspect.bpf.c -- -I/usr/include/x86_64-linux-gnu -D__TARGET_ARCH_x86 -Wall -Werror
