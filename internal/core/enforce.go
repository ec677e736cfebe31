package core

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/ns"
)

// Default limits of a sandbox created without its own (Config.DefaultResources
// fields left 0): a fork bomb or a memory hog in one sandbox must not take
// the host down, while an agent's ordinary work (compilers, test suites)
// fits.
const (
	DefaultPids          = 4096
	defaultMemoryCeiling = 4 << 30
)

// DefaultMemory is the default memory limit: half of the host's RAM, at
// most 4 GiB.
func DefaultMemory() int64 {
	total := memTotal()
	if total <= 0 {
		return defaultMemoryCeiling
	}
	return min(int64(defaultMemoryCeiling), total/2)
}

// DefaultCPUMillis is the default CPU limit: every CPU of the host, so
// the quota is visible and enforced but takes nothing a sandbox alone on
// the host could use.
func DefaultCPUMillis() int64 { return int64(runtime.NumCPU()) * 1000 }

// memTotal reads MemTotal from /proc/meminfo, in bytes (0 if unknown).
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		f := bytes.Fields(s.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemTotal:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// resolveResources fills the fields a create request left 0 with the
// daemon's defaults; what is in force is recorded, so a sandbox keeps
// its limits when the daemon's defaults change, and forks inherit them.
// -1 (none) stays.
func (m *Manager) resolveResources(r meta.Resources) meta.Resources {
	def := m.cfg.DefaultResources
	pick := func(v, d, auto int64) int64 {
		switch {
		case v != 0:
			return v
		case d != 0:
			return d
		}
		return auto
	}
	// A default the host's cgroups cannot enforce is dropped (with a
	// log line) rather than failing every create; a sandbox's own limit
	// is refused there (not_supported).
	avail := func(ctrl string, v, own int64) int64 {
		if own == 0 && v > 0 && !cgroup.Available(ctrl) {
			m.log.Warn("default limit not applied: no such cgroup controller here", "controller", ctrl)
			return -1
		}
		return v
	}
	own := r
	r.MemoryBytes = avail("memory", pick(r.MemoryBytes, def.MemoryBytes, DefaultMemory()), own.MemoryBytes)
	r.Pids = avail("pids", pick(r.Pids, def.Pids, DefaultPids), own.Pids)
	r.CPUMillis = avail("cpu", pick(r.CPUMillis, def.CPUMillis, DefaultCPUMillis()), own.CPUMillis)
	if r.IOWeight == 0 && def.IOWeight > 0 && avail("io", def.IOWeight, 0) > 0 {
		r.IOWeight = def.IOWeight
	}
	return r
}

// cgResources is what a sandbox's own limits are in its cgroup (-1, and
// 0 in records older than defaults, are none).
func cgResources(r meta.Resources) cgroup.Resources {
	pos := func(v int64) int64 { return max(v, 0) }
	return cgroup.Resources{MemoryMax: pos(r.MemoryBytes), PidsMax: pos(r.Pids), CPUMillis: pos(r.CPUMillis), IOWeight: pos(r.IOWeight)}
}

// tamperMetric counts the limits found changed behind the daemon's back,
// on the Manager's registry.
var tamperMetrics sync.Map // *prometheus.Registry -> *prometheus.CounterVec

func (m *Manager) tamperCounter() *prometheus.CounterVec {
	if c, ok := tamperMetrics.Load(m.metrics.reg); ok {
		return c.(*prometheus.CounterVec)
	}
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "molt_limits_tampered_total",
		Help: "Sandbox cgroup limits found changed behind the daemon's back (and written back), by limit.",
	}, []string{"limit"})
	if prev, loaded := tamperMetrics.LoadOrStore(m.metrics.reg, c); loaded {
		return prev.(*prometheus.CounterVec)
	}
	if err := m.metrics.reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			return are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	return c
}

// enforceLimits re-checks the limits the daemon wrote into the sandbox's
// cgroup (memory, pids, cpu, I/O weight, devices) before a checkpoint or
// a restore (when), writes back any that changed, and reports it: a log
// line, the molt_limits_tampered_total metric, and the sandbox's
// LimitsTampered and LastTampered (in rec and its stored record). The
// sandbox's own processes cannot reach these files (they are one level
// above their cgroup namespace's root); this catches whatever else did.
// Caller holds the sandbox's lock.
func (m *Manager) enforceLimits(rec *sandboxRec, when string) {
	cg, err := cgroup.Load(m.cgroupName(rec.ID))
	if err != nil {
		return
	}
	m.lim.mu.Lock()
	if m.lim.pending[rec.ID] {
		// A limit is being lowered to what the rooms allow (v1 refused
		// it below the charge): it differs on purpose until then.
		m.lim.mu.Unlock()
		return
	}
	want := m.withRoomsLocked(rec.ID, rec.Resources)
	drifts, err := cg.Enforce(want)
	m.lim.mu.Unlock()
	if err != nil && !errors.Is(err, errdefs.ErrNotSupported) {
		m.log.Warn("cannot check the sandbox's limits", "sandbox", rec.ID, "err", err)
	}
	if len(drifts) == 0 {
		return
	}
	ev := &meta.LimitsTampered{Time: time.Now().UTC(), When: when}
	c := m.tamperCounter()
	for _, d := range drifts {
		ev.Limits = append(ev.Limits, d.String())
		c.WithLabelValues(d.Limit).Inc()
	}
	m.log.Warn("sandbox limits changed behind the daemon's back; restored", "sandbox", rec.ID, "when", when, "limits", ev.Limits, "restore_err", err)
	note := func(r *sandboxRec) {
		r.LimitsTampered++
		r.LastTampered = ev
	}
	note(rec)
	var cur sandboxRec
	if m.db.Get(meta.Sandboxes, rec.ID, &cur) == nil {
		note(&cur)
		if err := m.db.Put(meta.Sandboxes, rec.ID, cur); err != nil {
			m.log.Warn("cannot record limit tampering", "sandbox", rec.ID, "err", err)
		}
	}
}

// cgnsRoomBytes is the room of the helper that makes a sandbox's cgroup
// namespace (a Go process for a few milliseconds).
const cgnsRoomBytes = 32 << 20

// cgroupNS opens a cgroup namespace rooted at the sandbox's leaf cgroup,
// for the CRIU that restores its processes: CRIU with
// --manage-cgroups=ignore makes none, and the tree inherits CRIU's. The
// running init's is taken when it has one, else a helper makes one (a
// fork's first restore, a resume). A legacy cgroup (no leaf) gets none
// (File nil). The caller closes the Ref.
func (m *Manager) cgroupNS(rec sandboxRec, cg *cgroup.Cgroup) (ns.Ref, error) {
	if cg.Legacy() {
		return ns.Ref{}, nil
	}
	if r, ok := rec.Init.OwnCgroupNS(); ok {
		return r, nil
	}
	key := "cgns-" + newID()
	if err := m.reserveRoom(rec, key, room{mem: cgnsRoomBytes, pids: 1}); err != nil {
		return ns.Ref{}, err
	}
	defer m.releaseRoom(rec.ID, key)
	r, err := m.launcher.CgroupNS(cg.Add)
	if err != nil {
		return ns.Ref{}, fmt.Errorf("cgroup namespace: %w", err)
	}
	return r, nil
}
