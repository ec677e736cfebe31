package hot

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/sandbox"
	"golang.org/x/sys/unix"
)

// A Standby is a sandbox's full checkpoint restored ahead of need: its
// processes restored by CRIU, stopped, on their own writable snapshot of
// the checkpoint's files, in the sandbox's cgroup. A rollback to that
// checkpoint promotes it (continue the standby, kill the live tree,
// switch the root): the hot tier, with no CRIU on the critical path.
//
// Policy: a sandbox keeps standbys for the checkpoints a rollback most
// likely returns to: its head, when the head is a full checkpoint, and
// the full checkpoints the caller marked to keep (newest first). They
// are made in the background, one at a time, once the head has stayed
// put for Delay. Their memory (the size of their checkpoints' images)
// is bounded per sandbox and across the host (Admit): the wanted
// checkpoints are admitted in that order while they fit both, and a
// sandbox's standbys that no longer fit (a new head before kept ones)
// are evicted; other sandboxes' standbys are not. Standbys live only in
// the daemon: a restarted daemon kills the ones it finds and makes new
// ones on the next checkpoint or rollback.
type Standby struct {
	Sandbox    string // whose pool it is in
	Checkpoint string
	Init       sandbox.Init
	Root       string
	Bytes      int64
	Key        string // of its takeover record (Record)
	// Its room in the sandbox's limits, its tasks, and the OOM kills of
	// the cgroup when it was made.
	Room    string
	Tasks   []Task
	OOMSeen int64
}

// Delay is how long a sandbox's head must stay put before a standby is
// prepared for it. An agent waiting for its model leaves it far longer.
const Delay = 100 * time.Millisecond

// StandbyHooks is what the standby table needs of core.
type StandbyHooks struct {
	// Head returns the sandbox's head checkpoint; false once the
	// sandbox is gone.
	Head func(id string) (string, bool)
	// Prepare starts one preparation of the sandbox's standbys as a
	// background job. done is closed when the job ends; await says the
	// waiter must see it end even at Close (a job run outside the
	// scheduler), else a job the scheduler drops at Close, which never
	// closes done, is not waited for.
	Prepare func(id string) (done <-chan struct{}, await bool)
	// Release frees what a discarded standby holds besides its
	// processes: its room, its root, its takeover record.
	Release func(s *Standby)
}

// Standbys is the table of ready standbys, per sandbox and checkpoint,
// and the waiters that prepare them.
type Standbys struct {
	hooks  StandbyHooks
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // waiters

	mu sync.Mutex
	// sandbox ID -> checkpoint ID -> standby
	// +checklocks:mu
	m map[string]map[string]*Standby
	// waiting marks sandboxes with a waiter.
	// +checklocks:mu
	waiting map[string]bool
	// +checklocks:mu
	closed bool
}

// NewStandbys returns an empty table.
func NewStandbys(h StandbyHooks) *Standbys {
	ctx, cancel := context.WithCancel(context.Background())
	return &Standbys{hooks: h, ctx: ctx, cancel: cancel, m: map[string]map[string]*Standby{}, waiting: map[string]bool{}}
}

// Get returns the sandbox's standby of checkpoint ck, if one is ready;
// it stays in the table.
func (p *Standbys) Get(id, ck string) *Standby {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[id][ck]
}

// Checkpoints lists the sandbox's checkpoints with a standby ready.
func (p *Standbys) Checkpoints(id string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for ck := range p.m[id] {
		out = append(out, ck)
	}
	sort.Strings(out)
	return out
}

// Bytes is the memory the sandbox's standbys hold.
func (p *Standbys) Bytes(id string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, s := range p.m[id] {
		n += s.Bytes
	}
	return n
}

// OthersBytes is the memory the standbys of every other sandbox hold.
func (p *Standbys) OthersBytes(id string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for sid, set := range p.m {
		if sid == id {
			continue
		}
		for _, s := range set {
			n += s.Bytes
		}
	}
	return n
}

// Totals counts the standbys of the host and the memory they hold.
func (p *Standbys) Totals() (n int, bytes int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, set := range p.m {
		n += len(set)
		for _, s := range set {
			bytes += s.Bytes
		}
	}
	return n, bytes
}

// Put adds a prepared standby to the table. After Close it is
// discarded instead.
func (p *Standbys) Put(s *Standby) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.Discard(s, true)
		return
	}
	if p.m[s.Sandbox] == nil {
		p.m[s.Sandbox] = map[string]*Standby{}
	}
	p.m[s.Sandbox][s.Checkpoint] = s
	p.mu.Unlock()
}

// Take takes the sandbox's standby of checkpoint ck out of the table.
func (p *Standbys) Take(id, ck string) *Standby {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.m[id][ck]
	if s != nil {
		delete(p.m[id], ck)
	}
	return s
}

// Discard kills the standby's processes (with kill; else they are gone
// already) and releases the rest (StandbyHooks.Release).
func (p *Standbys) Discard(s *Standby, kill bool) {
	if kill && s.Init.Signal(unix.SIGKILL) == nil {
		WaitGone(s.Init, 5*time.Second)
	}
	p.hooks.Release(s)
}

// Drop forgets the sandbox's standbys, killing their processes unless
// they are already gone, and releases them.
func (p *Standbys) Drop(id string, kill bool) {
	p.mu.Lock()
	set := p.m[id]
	delete(p.m, id)
	p.mu.Unlock()
	for _, s := range set {
		p.Discard(s, kill)
	}
}

// DropOf drops the sandbox's standby of checkpoint ck, if any.
func (p *Standbys) DropOf(id, ck string, kill bool) {
	if s := p.Take(id, ck); s != nil {
		p.Discard(s, kill)
	}
}

// Schedule prepares, in the background, the standbys the policy wants
// for the sandbox, once its head has stayed put for delay. One waiter
// per sandbox follows the head until it stays put.
func (p *Standbys) Schedule(id string, delay time.Duration) {
	p.mu.Lock()
	if p.closed || p.waiting[id] {
		p.mu.Unlock()
		return
	}
	p.waiting[id] = true
	p.wg.Add(1)
	p.mu.Unlock()
	head, _ := p.hooks.Head(id)
	go func() {
		defer p.wg.Done()
		settled := p.settle(id, head, delay)
		p.mu.Lock()
		delete(p.waiting, id)
		p.mu.Unlock()
		if !settled {
			return
		}
		done, await := p.hooks.Prepare(id)
		if await {
			<-done
			return
		}
		select {
		case <-done:
		case <-p.ctx.Done():
		}
	}()
}

// Wait waits for the waiters in flight and, when they wait for it, the
// preparation each started.
func (p *Standbys) Wait() { p.wg.Wait() }

// settle waits until the sandbox's head has stayed put for delay: a
// caller that moves the sandbox again at once (a tree search, an RL
// loop) would make a standby of it useless, and its CRIU restore would
// only take CPU from the foreground. (An fs checkpoint moves the head
// too; the kept standbys are still wanted then.) It returns false at
// Close or once the sandbox is gone.
func (p *Standbys) settle(id, head string, delay time.Duration) bool {
	for {
		select {
		case <-time.After(delay):
		case <-p.ctx.Done():
			return false
		}
		now, ok := p.hooks.Head(id)
		if !ok {
			return false
		}
		if now == head {
			return true
		}
		head = now
	}
}

// Close ends the waiters (a preparation run outside the scheduler is
// waited for) and discards every standby, killing its processes. Core
// closes the job scheduler first, so no preparation runs after it.
func (p *Standbys) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	ids := make([]string, 0, len(p.m))
	for id := range p.m {
		ids = append(ids, id)
	}
	p.mu.Unlock()
	for _, id := range ids {
		p.Drop(id, true)
	}
}

// Admit keeps, in order, the wanted checkpoints whose standbys fit the
// sandbox's own budget own (-1: none allowed, 0: no bound of its own)
// and what others (the other sandboxes' standbys) leave of the host's
// budget host; refused says why the first one left out was (nil if none
// was). size gives a wanted checkpoint's ID and its images' size.
func Admit[C any](sandboxID string, own, host, others int64, wanted []C, size func(C) (string, int64)) (admitted []C, refused error) {
	if own < 0 {
		if len(wanted) > 0 {
			refused = fmt.Errorf("sandbox %s allows no standbys", sandboxID)
		}
		return nil, refused
	}
	var sum int64
	for _, c := range wanted {
		id, n := size(c)
		switch {
		case own > 0 && sum+n > own:
			if refused == nil {
				refused = fmt.Errorf("standby of %s needs %d bytes; the sandbox's standbys before it take %d of its budget of %d", id, n, sum, own)
			}
		case others+sum+n > host:
			if refused == nil {
				refused = fmt.Errorf("standby of %s needs %d bytes; %d of the host's budget of %d are taken", id, n, others+sum, host)
			}
		default:
			admitted = append(admitted, c)
			sum += n
		}
	}
	return admitted, refused
}

// Task is one task of a standby and the oom_score_adj CRIU restored it
// with.
type Task struct {
	Pid int
	Adj string
}

// Intact reports whether every task of the standby still lives (a
// killed one stays a zombie: its parent is stopped).
func (s *Standby) Intact() bool {
	if !s.Init.Alive() {
		return false
	}
	for _, t := range s.Tasks {
		if !taskRunnable(t.Pid) {
			return false
		}
	}
	return true
}

// taskRunnable reports whether pid exists and is neither a zombie nor
// dead.
func taskRunnable(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	st := b[i+2]
	return st != 'Z' && st != 'X' && st != 'x'
}

// FirstVictims makes the standby's tree (the processes tree) the OOM
// killer's first choice in its cgroup and returns its tasks with the
// oom_score_adj each had. Raising it needs no privilege; lowering it
// back to a value it had needs none either.
func FirstVictims(tree []int) ([]Task, error) {
	out := make([]Task, 0, len(tree))
	for _, pid := range tree {
		p := "/proc/" + strconv.Itoa(pid) + "/oom_score_adj"
		b, err := os.ReadFile(p)
		if err != nil {
			return out, err
		}
		out = append(out, Task{Pid: pid, Adj: strings.TrimSpace(string(b))})
		if err := os.WriteFile(p, []byte("1000"), 0); err != nil {
			return out, err
		}
	}
	return out, nil
}

// RestoreAdj gives the standby's tasks their own oom_score_adj back.
func RestoreAdj(tasks []Task) error {
	for _, t := range tasks {
		if err := os.WriteFile("/proc/"+strconv.Itoa(t.Pid)+"/oom_score_adj", []byte(t.Adj), 0); err != nil {
			return err
		}
	}
	return nil
}

// WaitGone waits until init has exited (its PID namespace torn down),
// at most limit.
func WaitGone(init sandbox.Init, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for init.Alive() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}
