package turn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/sbinit"
)

type procRole int

const (
	roleOther procRole = iota
	roleInit
	roleSession
)

// procInfo is what the turn baseline keeps of a process.
type procInfo struct {
	start   uint64 // start time in clock ticks: tells a reused PID apart
	comm    string
	cpu     uint64 // nanoseconds on CPU, all threads
	slices  uint64 // timeslices run, all threads
	vol     uint64 // voluntary context switches (blocking), all threads
	running bool   // a thread is runnable
	role    procRole
	// pos is where each thread is in user space (stack and instruction
	// pointers from /proc/PID/task/TID/syscall): after a freeze and thaw
	// a task that only restarted its interrupted system call is back
	// where it was.
	pos string
}

// settleLimit bounds how long a baseline waits for a tree that was just
// continued to go back to sleep.
const settleLimit = 250 * time.Millisecond

// settle lists the live tree's processes once none of its long-lived
// ones runs, or when limit has passed.
func (t *Tracker) settle(ctx context.Context, id string, init sandbox.Init, sessionPids map[int]bool, limit time.Duration) (map[int]procInfo, error) {
	deadline := time.Now().Add(limit)
	for {
		procs, err := t.liveProcs(id, init, sessionPids)
		if err != nil {
			return procs, err
		}
		busy := false
		for _, p := range procs {
			busy = busy || (p.running && p.role == roleOther)
		}
		if !busy || time.Now().After(deadline) || ctx.Err() != nil {
			return procs, nil
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// samePos reports whether every thread of a process is where it was: same
// stack pointer, and the same instruction pointer or 2 bytes on (a
// system call restarted after a freeze re-executes its 2-byte syscall
// instruction, which the freeze had rewound the pointer to).
func samePos(frozen, now string) bool {
	a, b := strings.Fields(frozen), strings.Fields(now)
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] == b[i] {
			continue
		}
		ta, pa, ok1 := strings.Cut(a[i], ",")
		tb, pb, ok2 := strings.Cut(b[i], ",")
		if !ok1 || !ok2 || ta != tb { // tid:sp differ
			return false
		}
		x, err1 := strconv.ParseUint(strings.TrimPrefix(pa, "0x"), 16, 64)
		y, err2 := strconv.ParseUint(strings.TrimPrefix(pb, "0x"), 16, 64)
		if err1 != nil || err2 != nil || y-x != 2 {
			return false
		}
	}
	return true
}

// sessionStates asks init for its sessions and their state digests.
func sessionStates(ctx context.Context, init sandbox.Init) (map[string]string, map[int]bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := init.Call(cctx, sbinit.Request{Op: "status"})
	if err != nil {
		return nil, nil, err
	}
	sess, pids := map[string]string{}, map[int]bool{}
	for _, s := range resp.Sessions {
		sess[s.Name] = s.Digest
		// init reports PIDs in the sandbox's namespace; the baseline
		// keys processes by host PID.
		pids[s.Pid] = true
	}
	return sess, pids, nil
}

// liveProcs lists the processes of the sandbox's live tree (its cgroup,
// in init's PID namespace or one below it; standbys and CRIU's helpers
// are elsewhere) with their scheduling counters. sessionPids holds the
// sessions' shells by PID inside the sandbox.
func (t *Tracker) liveProcs(id string, init sandbox.Init, sessionPids map[int]bool) (map[int]procInfo, error) {
	tree, err := t.cfg.Tree(id, init)
	if err != nil {
		return nil, err
	}
	type proc struct {
		info         procInfo
		nspid, level int
	}
	read := map[int]proc{}
	for _, pid := range tree {
		p, nspid, level, err := readProc(pid)
		if err == nil { // else exited meanwhile
			read[pid] = proc{p, nspid, level}
		}
	}
	top, ok := read[init.Pid]
	if !ok {
		return nil, fmt.Errorf("init %d is gone", init.Pid)
	}
	out := map[int]procInfo{}
	for pid, p := range read {
		switch {
		case pid == init.Pid:
			p.info.role = roleInit
		case p.level == top.level && sessionPids[p.nspid]:
			p.info.role = roleSession
		}
		out[pid] = p.info
	}
	return out, nil
}

// readProc reads a process's identity and scheduling counters (summed
// over its threads), its PID in its own PID namespace and that
// namespace's level (0: the host's).
func readProc(pid int) (procInfo, int, int, error) {
	dir := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return procInfo{}, 0, 0, err
	}
	var p procInfo
	i, j := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
	if i < 0 || j < i {
		return procInfo{}, 0, 0, errors.New("bad stat")
	}
	p.comm = string(b[i+1 : j])
	f := strings.Fields(string(b[j+1:]))
	if len(f) < 20 {
		return procInfo{}, 0, 0, errors.New("bad stat")
	}
	p.start, _ = strconv.ParseUint(f[19], 10, 64)
	nspid, level := pid, 0
	if st, err := os.ReadFile(dir + "/status"); err == nil {
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
				if ff := strings.Fields(v); len(ff) > 0 {
					nspid, _ = strconv.Atoi(ff[len(ff)-1])
					level = len(ff) - 1
				}
			}
		}
	}
	tasks, err := os.ReadDir(dir + "/task")
	if err != nil {
		return procInfo{}, 0, 0, err
	}
	for _, t := range tasks {
		readTask(&p, dir+"/task/"+t.Name(), t.Name())
	}
	return p, nspid, level, nil
}

// readTask adds a thread's counters, state and position to p.
func readTask(p *procInfo, td, tid string) {
	if s, err := os.ReadFile(td + "/schedstat"); err == nil {
		if ff := strings.Fields(string(s)); len(ff) >= 3 {
			c, _ := strconv.ParseUint(ff[0], 10, 64)
			n, _ := strconv.ParseUint(ff[2], 10, 64)
			p.cpu += c
			p.slices += n
		}
	}
	if s, err := os.ReadFile(td + "/stat"); err == nil {
		if k := strings.LastIndexByte(string(s), ')'); k >= 0 && k+2 < len(s) && s[k+2] == 'R' {
			p.running = true
		}
	}
	if s, err := os.ReadFile(td + "/status"); err == nil {
		if _, v, ok := strings.Cut(string(s), "\nvoluntary_ctxt_switches:"); ok {
			v, _, _ = strings.Cut(v, "\n")
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			p.vol += n
		}
	}
	if s, err := os.ReadFile(td + "/syscall"); err == nil {
		// "nr args... sp pc", "-1 sp pc" or "running".
		f := strings.Fields(string(s))
		if len(f) >= 2 {
			f = f[len(f)-2:]
		}
		p.pos += tid + ":" + strings.Join(f, ",") + " "
	}
}
