package hot

import (
	"context"
	"sync"

	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/sandbox"
)

// Spares holds CRIUs started ahead, per sandbox:
//
//   - for restores (a warm rollback, a standby), once the sandbox has
//     restored processes: a CRIU in fresh namespaces, already moved into
//     the sandbox's cgroups. Moving a process into a cgroup waits for an
//     RCU grace period per hierarchy: 12-18 ms for a sandbox's seven here,
//     which every restore paid on its critical path. Its key is the
//     sandbox's ID.
//   - for dumps, once the sandbox has taken a full checkpoint: a CRIU in
//     the namespaces of the sandbox's tree that checkpoints leave out of
//     the images. Starting CRIU until it can dump took 6-7 ms of every
//     checkpoint call (not of the frozen window). Its key is DumpKey.
type Spares struct {
	// release frees what the spare under key held besides its process
	// (a restore spare's room in its sandbox's limits).
	release func(key string)
	// failed hears why a refill started no spare.
	failed func(key string, err error)
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // refills

	mu sync.Mutex
	// key -> ready spare
	// +checklocks:mu
	m map[string]*Spare
	// key -> closed when its refill ends
	// +checklocks:mu
	filling map[string]chan struct{}
	// bumped by drop: a refill under an older one is void
	// +checklocks:mu
	gen map[string]int
	// +checklocks:mu
	closed bool
}

// A Spare is one CRIU started ahead. A dump spare serves a dump of the
// tree of Init, leaving the namespace types Outside out of the images.
type Spare struct {
	S       *criu.Spare
	Init    sandbox.Init
	Outside int
}

// NewSpares returns an empty table; release and failed are as in Spares.
func NewSpares(release func(key string), failed func(key string, err error)) *Spares {
	ctx, cancel := context.WithCancel(context.Background())
	return &Spares{release: release, failed: failed, ctx: ctx, cancel: cancel,
		m: map[string]*Spare{}, filling: map[string]chan struct{}{}, gen: map[string]int{}}
}

// DumpKey is the key of a sandbox's dump spare (a restore spare's is the
// sandbox's ID).
func DumpKey(id string) string { return "dump:" + id }

// Take takes the ready spare under key, if any.
func (p *Spares) Take(key string) *Spare {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.m[key]
	delete(p.m, key)
	return e
}

// Ready returns the ready spare under key, if any; it stays ready.
func (p *Spares) Ready(key string) *Spare {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[key]
}

// Wait waits for the refills in flight.
func (p *Spares) Wait() { p.wg.Wait() }

// TakeDump takes the sandbox's ready dump spare if it runs in the
// namespaces a dump of init's tree leaving outside out needs; a stale
// one is killed.
func (p *Spares) TakeDump(id string, init sandbox.Init, outside int) *criu.Spare {
	e := p.Take(DumpKey(id))
	if e == nil {
		return nil
	}
	if e.Init != init || e.Outside != outside {
		go e.S.Kill() // waits for its exit: not on the checkpoint's path
		return nil
	}
	return e.S
}

// Refill runs start in the background and keeps its spare under key,
// unless one is ready or on its way there. start's context ends at
// Close.
func (p *Spares) Refill(key string, start func(context.Context) (*Spare, error)) {
	p.mu.Lock()
	if p.closed || p.m[key] != nil || p.filling[key] != nil {
		p.mu.Unlock()
		return
	}
	done := make(chan struct{})
	p.filling[key] = done
	gen := p.gen[key]
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		defer close(done)
		e, err := start(p.ctx)
		p.mu.Lock()
		delete(p.filling, key)
		if err == nil && !p.closed && p.gen[key] == gen {
			p.m[key], e = e, nil
		}
		p.mu.Unlock()
		if err != nil {
			p.failed(key, err)
		} else if e != nil {
			e.S.Kill()
			p.release(key)
		}
	}()
}

// Drop kills the sandbox's spares and waits for refills in flight
// (whose results are then killed): after it, no spare of the sandbox
// lives in its cgroup or its namespaces until the next refill. Callers
// about to kill or remove the sandbox call it first.
func (p *Spares) Drop(id string) {
	p.dropKey(id)
	p.dropKey(DumpKey(id))
}

// dropKey kills the spare under key and waits for a refill in flight.
func (p *Spares) dropKey(key string) {
	p.mu.Lock()
	e := p.m[key]
	delete(p.m, key)
	done := p.filling[key]
	p.gen[key]++
	p.mu.Unlock()
	if e != nil {
		e.S.Kill()
	}
	if done != nil {
		<-done
	}
	p.release(key)
}

// Close kills every spare and waits for the refills in flight; no
// refill starts after it.
func (p *Spares) Close() {
	p.mu.Lock()
	p.closed = true
	keys := make([]string, 0, len(p.m)+len(p.filling))
	for k := range p.m {
		keys = append(keys, k)
	}
	for k := range p.filling {
		keys = append(keys, k)
	}
	p.mu.Unlock()
	p.cancel()
	for _, k := range keys {
		p.dropKey(k)
	}
	p.wg.Wait()
}
