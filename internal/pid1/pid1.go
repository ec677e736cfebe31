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

import (
	_ "embed"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

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

// Copying: pid1 answers SIGUSR2 from outside its PID namespace by making
// a copy of itself that stops at once (a child, in the same namespace):
// a checkpoint that copies the tree instead of dumping it frozen
// (docs/templates.md) dumps that copy after the thaw and restores it as
// PID 1. A process of the sandbox cannot trigger it (its kill reads as
// its own PID, not 0; a forged si_pid 0 through rt_sigqueueinfo carries a
// negative si_code, and pid1 takes only SI_USER), and a copy let go
// before its dump ends. pid1 is not dumpable, so the sandbox's processes
// (root, with pid1's capabilities) cannot ptrace it or read its /proc
// files either.

// CopySignal is the signal that asks pid1 for a copy of itself.
const CopySignal = unix.SIGUSR2

// CanCopy says whether the pid1 running as host PID pid makes copies of
// itself (one built before copying blocked no SIGUSR2, the mark of
// those that do: they take it from a signalfd).
func CanCopy(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "SigBlk:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<(CopySignal-1)) != 0
		}
	}
	return false
}
