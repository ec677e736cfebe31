package hot

import (
	"context"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/sandbox"
)

// Roots retired by rollbacks are deleted once their sandbox has not
// rolled back for RetireQuiet, or all at once when it holds
// RetireBacklog of them: garbage is collected while the sandbox idles,
// not between the rollbacks and captures of a tree search. Deleting
// right away (a GC job per rollback, each deletion a btrfs transaction
// of its own next to the following captures and restores) cost 15-20 %
// of the nodes of `molt bench search`, and a backlog of 64 still about
// 15 %. A retired root holds little of its own (what the sandbox wrote
// since the checkpoint it left); stopping or removing the sandbox
// deletes them at once, and the next daemon start removes any a crash
// left.
const (
	RetireQuiet   = time.Second
	RetireBacklog = 256
)

// A RetiredRoot is a root a rollback replaced, and the init of the tree
// that ran on it (killed, maybe not gone yet).
type RetiredRoot struct {
	Path string
	Init sandbox.Init
}

// Retired collects the roots rollbacks replaced.
type Retired struct {
	// collect hands a sandbox's retired roots to a GC job (which calls
	// Remove); it is not called after Close.
	collect func(id string, roots []RetiredRoot)
	// remove deletes a root (a subvolume or a directory).
	remove func(path string) error
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // pending and running timer functions

	mu sync.Mutex
	// sandbox ID -> retired roots not yet deleted
	// +checklocks:mu
	m map[string][]RetiredRoot
	// sandbox ID -> pending collection
	// +checklocks:mu
	timers map[string]*time.Timer
}

// NewRetired returns an empty collector; collect and remove are as in
// Retired.
func NewRetired(collect func(id string, roots []RetiredRoot), remove func(path string) error) *Retired {
	ctx, cancel := context.WithCancel(context.Background())
	return &Retired{collect: collect, remove: remove, ctx: ctx, cancel: cancel,
		m: map[string][]RetiredRoot{}, timers: map[string]*time.Timer{}}
}

// Retire hands a root that a rollback replaced to the collector.
func (p *Retired) Retire(id, root string, init sandbox.Init) {
	p.mu.Lock()
	p.m[id] = append(p.m[id], RetiredRoot{root, init})
	p.stopLocked(id)
	if len(p.m[id]) < RetireBacklog && p.ctx.Err() == nil {
		p.wg.Add(1)
		p.timers[id] = time.AfterFunc(RetireQuiet, func() {
			defer p.wg.Done()
			p.collectNow(id)
		})
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.collectNow(id)
}

// stopLocked cancels the sandbox's pending collection.
//
// +checklocks:p.mu
func (p *Retired) stopLocked(id string) {
	if t := p.timers[id]; t != nil {
		if t.Stop() {
			p.wg.Done() // its function never runs
		}
		delete(p.timers, id)
	}
}

// Take takes the sandbox's retired roots from the collector and cancels
// their pending collection.
func (p *Retired) Take(id string) []RetiredRoot {
	p.mu.Lock()
	defer p.mu.Unlock()
	roots := p.m[id]
	delete(p.m, id)
	p.stopLocked(id)
	return roots
}

// collectNow hands the sandbox's retired roots to collect.
func (p *Retired) collectNow(id string) {
	roots := p.Take(id)
	if len(roots) == 0 || p.ctx.Err() != nil {
		return // after Close the next start removes them
	}
	p.collect(id, roots)
}

// Remove deletes each root once its tree is gone; failed hears of each
// that could not be deleted, and the first error is returned.
func (p *Retired) Remove(roots []RetiredRoot, failed func(RetiredRoot, error)) error {
	var first error
	for _, r := range roots {
		WaitGone(r.Init, 10*time.Second)
		if err := p.remove(r.Path); err != nil {
			failed(r, err)
			if first == nil {
				first = err
			}
		}
	}
	return first
}

// Close cancels pending collections (the roots stay for the next start
// to remove) and waits for one being handed over.
func (p *Retired) Close() {
	p.cancel()
	p.mu.Lock()
	for id := range p.timers {
		p.stopLocked(id)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
