// Package pid1 holds a small, single-threaded PID 1 for sandboxes
// (csrc/pid1.c, built static) and the client that talks to it.
//
// A CRIU dump stops and parasite-calls every thread of every process in
// the tree, and copies every private page: molt's Go init (six threads,
// 64 mappings, about 2 MiB of anonymous memory) costs 7-11 ms of each
// full checkpoint's frozen window, pid1 about 1 ms (a single thread, a
// handful of mappings and pages). pid1 only reaps, starts processes with
// the descriptors it is handed, keeps descriptors it is asked to keep
// (the parent ends of a session's pipes: a dump then holds both ends,
// and the next client takes them back after a restore), reports exit
// statuses and sends signals. The logic (sessions, exec relays, state
// digests) runs in the client, outside the dumped tree.
//
// The protocol: a client outside the PID namespace connects to pid1's
// abstract SOCK_SEQPACKET socket and sends one request, descriptors
// attached with SCM_RIGHTS; pid1 answers with one response, descriptors
// attached, and the connection ends. A request is a fixed header (12
// little-endian 32-bit fields, see header) followed by data: for spawn,
// the supplementary groups (32-bit each), then the NUL-terminated tag,
// program, working directory, arguments and environment strings; for
// drop, the tag. A response is a fixed header (8 fields, see response)
// followed by data: for table, "tag NUL pid NUL count NUL" per entry.
package pid1

import _ "embed"

//go:generate sh -c "musl-gcc -static -Os -s -Wall -Wextra -Werror -o pid1.bin csrc/pid1.c"

// executable is pid1 built from csrc/pid1.c (static, musl): go generate rebuilds
// it (musl-tools).
//
//go:embed pid1.bin
var executable []byte

// Binary returns the pid1 executable.
func Binary() []byte { return executable }

// Version is the protocol version pid1 reports; a client refuses another.
const Version = 1
