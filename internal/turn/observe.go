package turn

import (
	"context"
	"fmt"
	"sort"

	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sandbox"
)

// observe collects what the current turn did. Caller holds ts.mu.
func (t *Tracker) observe(ctx context.Context, id string, init sandbox.Init, ts *state) observation {
	obs := observation{force: append([]string(nil), ts.force...)}
	obs.effects = ts.carry
	if ts.watch == nil {
		_, why := InspectorStatus()
		if why == "" {
			why = "no watch on this sandbox"
		}
		obs.force = append(obs.force, "inspector unavailable ("+why+"): files and processes may have changed")
	} else {
		e, err := ts.watch.Cut(ctx)
		if err != nil {
			obs.force = append(obs.force, "inspector: "+err.Error())
		}
		obs.effects = mergeEffects(obs.effects, e)
	}
	if ts.tree.Pid != init.Pid || ts.tree.Start != init.Start {
		obs.force = append(obs.force, "the process tree was replaced since the turn began")
	}
	sess, spids, err := sessionStates(ctx, init)
	if err != nil {
		obs.force = append(obs.force, "sessions unknown: "+err.Error())
	}
	obs.sessions, obs.sessionPids = sess, spids
	obs.sessChanges = sessionChanges(ts.sessions, sess)

	procs, err := t.liveProcs(id, init, spids)
	if err != nil {
		obs.force = append(obs.force, "processes unknown: "+err.Error())
	}
	obs.procs = procs
	obs.longLived = longLivedChanges(ts.procs, procs)
	return obs
}

// sessionChanges compares the sessions' digests with the baseline's.
func sessionChanges(before, now map[string]string) []meta.SessionChange {
	var out []meta.SessionChange
	for name, d := range now {
		prev, ok := before[name]
		switch {
		case !ok:
			out = append(out, meta.SessionChange{Name: name, Change: "created"})
		case prev != d:
			out = append(out, meta.SessionChange{Name: name, Change: "changed"})
		}
	}
	for name := range before {
		if _, ok := now[name]; !ok {
			out = append(out, meta.SessionChange{Name: name, Change: "closed"})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// longLivedChanges compares the long-lived processes with the baseline's.
func longLivedChanges(before, now map[int]procInfo) []meta.LongLivedChange {
	var out []meta.LongLivedChange
	for pid, p := range now {
		if p.role != roleOther {
			continue
		}
		prev, ok := before[pid]
		switch {
		case !ok || prev.start != p.start:
			out = append(out, meta.LongLivedChange{Pid: pid, Comm: p.comm, Change: "started"})
		case prev.role != roleOther:
			// A session's shell no longer a session (closed): counted
			// as a session change.
		case p.cpu != prev.cpu || p.slices != prev.slices || p.running:
			out = append(out, meta.LongLivedChange{Pid: pid, Comm: p.comm, Change: "ran"})
		}
	}
	for pid, prev := range before {
		if prev.role != roleOther {
			continue
		}
		if p, ok := now[pid]; !ok || p.start != prev.start {
			out = append(out, meta.LongLivedChange{Pid: pid, Comm: prev.comm, Change: "exited"})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out
}

// settled returns the baseline of a tree just thawed after a checkpoint.
// A freeze interrupts every blocked system call; after the thaw each
// task runs to restart it, which moves its scheduling counters although
// nothing changed. So the baseline is taken once the tree is asleep
// again, and a process that is not back where the freeze found it (its
// threads' user stack and instruction pointers) or that still runs makes
// the next turn full. Caller holds ts.mu.
func (t *Tracker) settled(ctx context.Context, id string, init sandbox.Init, sessionPids map[int]bool, frozen map[int]procInfo, ts *state) map[int]procInfo {
	procs, err := t.settle(ctx, id, init, sessionPids, settleLimit)
	if err != nil {
		ts.force = append(ts.force, "processes unknown after the checkpoint: "+err.Error())
		return procs
	}
	for pid, p := range procs {
		if p.role != roleOther {
			continue
		}
		f, ok := frozen[pid]
		switch {
		case frozen == nil:
			ts.force = append(ts.force, "no frozen view of the checkpoint's processes")
			return procs
		case !ok || f.start != p.start:
			ts.force = append(ts.force, fmt.Sprintf("long-lived process %s (%d) started right after the checkpoint", p.comm, pid))
		case p.running:
			ts.force = append(ts.force, fmt.Sprintf("long-lived process %s (%d) still runs after the checkpoint", p.comm, pid))
		case !samePos(f.pos, p.pos):
			ts.force = append(ts.force, fmt.Sprintf("long-lived process %s (%d) ran right after the checkpoint", p.comm, pid))
		}
	}
	return procs
}
