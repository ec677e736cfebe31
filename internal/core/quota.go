package core

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/meta"
)

// Disk quotas (docs/architecture.md, "Disk quotas"; docs/security.md,
// "Disk"). With simple quotas on the pool, each sandbox has a level-1
// qgroup, 1/<its ID as a number>, that holds its root and every
// subvolume made for it (checkpoint snapshots, their writable copies,
// rollback roots, standby roots): under simple quotas an extent is
// charged for its whole life to the subvolume that wrote it, so what a
// checkpoint keeps of data the root since overwrote stays charged to the
// sandbox. The group is limited to the sandbox's disk quota
// (meta.Resources.DiskBytes, or Config.DefaultDisk). Every sandbox group
// is a member of sandboxesQgroup, limited to what the pool can still
// take less the reserve, so that sandboxes together never eat the
// reserve the daemon keeps for metadata, checkpoint images and commits.

// sandboxesQgroup holds every sandbox's group.
var sandboxesQgroup = fsnap.Qgroup(2, 0)

// sandboxQgroup is the qgroup of sandbox id (IDs are 12 hex digits: 48
// bits, the width of a qgroup's ID).
func sandboxQgroup(id string) (uint64, error) {
	n, err := strconv.ParseUint(id, 16, 48)
	if err != nil || len(id) != 12 {
		return 0, fmt.Errorf("sandbox id %q is not 12 hex digits: %w", id, errdefs.ErrInvalidArgument)
	}
	return fsnap.Qgroup(1, n), nil
}

// quotaState is the pool's quota accounting.
type quotaState struct {
	mode fsnap.QuotaMode // QuotaOff when not available; set once by setupQuota
	why  string          // why quotas are off

	mu      sync.Mutex
	limited time.Time // when sandboxesQgroup's limit was last set
	limit   int64     // what it was set to

	wg sync.WaitGroup // the refresher (setupQuota); Close waits for it
}

// limitEvery is how often the limit of all sandboxes follows what else
// fills the pool (or the filesystem under a loop pool) between the
// daemon's own operations, which refresh it too.
const limitEvery = 5 * time.Second

// setupQuota turns simple quotas on in the pool (once: it marks the
// filesystem, which kernels before 6.7 then no longer mount) and makes
// the group of all sandboxes. Without them the daemon runs on, with
// disk quotas reported unsupported.
func (m *Manager) setupQuota() {
	q := &m.quota
	if m.opts.noDiskQuota {
		q.why = "disabled (--disk-quota=false)"
		return
	}
	mode, err := fsnap.Quota(m.pool.Dir)
	if err == nil && mode == fsnap.QuotaOff {
		if err = fsnap.EnableQuota(m.pool.Dir, fsnap.QuotaSimple); err == nil {
			mode = fsnap.QuotaSimple
		}
	}
	if err == nil {
		err = fsnap.CreateQgroup(m.pool.Dir, sandboxesQgroup)
	}
	if err != nil {
		q.why = err.Error()
		m.log.Warn("disk quotas unavailable: sandboxes share the pool without a bound of their own", "err", err)
		return
	}
	if mode == fsnap.QuotaFull {
		m.log.Warn("the pool has full qgroups (btrfs quota enable), not simple quotas: every snapshot and deletion pays for their accounting (docs/architecture.md, Disk quotas)")
	}
	q.mode = mode
	m.limitSandboxes(true)
	q.wg.Add(1)
	go func() {
		defer q.wg.Done()
		m.every(limitEvery, func() { m.limitSandboxes(false) })
	}()
}

// quotaFeature reports disk quotas in Host.
func (m *Manager) quotaFeature() meta.Feature {
	if m.quota.mode == fsnap.QuotaOff {
		return meta.Feature{Name: "disk-quota", Reason: m.quota.why}
	}
	d := m.quota.mode.String() + " btrfs quotas: a qgroup per sandbox (root and checkpoints)"
	if m.cfg.DefaultDisk > 0 {
		d += ", " + mib(m.cfg.DefaultDisk) + " unless created with its own"
	}
	return meta.Feature{Name: "disk-quota", Supported: true, Detail: d}
}

func mib(n int64) string { return strconv.FormatInt(n>>20, 10) + " MiB" }

// limitSandboxes sets the limit of the group of all sandboxes to what
// they hold plus what the pool can still take, less the reserve: their
// own writes leave the limit where it is, the daemon's writes (and
// anything else filling a loop pool's backing filesystem) lower it.
// Unless force, at most once a second.
func (m *Manager) limitSandboxes(force bool) {
	q := &m.quota
	if q.mode == fsnap.QuotaOff {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !force && time.Since(q.limited) < time.Second {
		return
	}
	m.limitSandboxesLocked()
}

// limitSandboxesLocked is limitSandboxes under quotaState.mu.
func (m *Manager) limitSandboxesLocked() {
	q := &m.quota
	s, err := m.pool.Space()
	if err != nil {
		m.log.Warn("cannot bound the sandboxes' disk use", "err", err)
		return
	}
	used, err := fsnap.QgroupUsage(m.pool.Dir, sandboxesQgroup)
	if err != nil {
		m.log.Warn("cannot bound the sandboxes' disk use", "err", err)
		return
	}
	// Never 0, which lifts the limit.
	limit := max(used+s.Avail()-m.reserve(), 1<<20)
	// Setting it dirties a transaction: not for a change under 1 MiB.
	if d := limit - q.limit; d > -1<<20 && d < 1<<20 {
		q.limited = time.Now()
		return
	}
	if err := fsnap.LimitQgroup(m.pool.Dir, sandboxesQgroup, limit); err != nil {
		m.log.Warn("cannot bound the sandboxes' disk use", "err", err)
		return
	}
	q.limited, q.limit = time.Now(), limit
}

// diskQuota returns the disk quota a new sandbox asking for req gets:
// req itself, or the daemon's default for 0; -1 asks for none.
func (m *Manager) diskQuota(req int64) (int64, error) {
	switch {
	case req < -1:
		return 0, fmt.Errorf("disk quota %d: want bytes, 0 for the daemon's default or -1 for none: %w", req, errdefs.ErrInvalidArgument)
	case req > 0 && m.quota.mode == fsnap.QuotaOff:
		return 0, fmt.Errorf("disk quota: %s: %w", m.quota.why, errdefs.ErrNotSupported)
	case req == 0 && m.quota.mode != fsnap.QuotaOff:
		return m.cfg.DefaultDisk, nil
	}
	return req, nil
}

// makeQgroup makes the qgroup of a new sandbox, limited to its quota,
// and returns the groups its subvolumes join and an undo; nothing with
// quotas off.
func (m *Manager) makeQgroup(rec *sandboxRec) ([]uint64, func() error, error) {
	none := func() error { return nil }
	if m.quota.mode == fsnap.QuotaOff {
		return nil, none, nil
	}
	g, err := sandboxQgroup(rec.ID)
	if err != nil {
		return nil, none, err
	}
	if err := fsnap.CreateQgroup(m.pool.Dir, g); err != nil {
		return nil, none, err
	}
	undo := func() error { return fsnap.DestroyQgroup(m.pool.Dir, g) }
	err = fsnap.AssignQgroup(m.pool.Dir, g, sandboxesQgroup, true)
	if err == nil && rec.Resources.DiskBytes > 0 {
		err = fsnap.LimitQgroup(m.pool.Dir, g, rec.Resources.DiskBytes)
	}
	if err != nil {
		_ = undo()
		return nil, none, err
	}
	rec.DiskGroup = true
	m.limitSandboxes(false)
	return []uint64{g}, undo, nil
}

// groupsOf returns the qgroups a new subvolume of the sandbox rec joins
// (none if it has no group: quotas off, or made before they were on).
func (m *Manager) groupsOf(rec sandboxRec) []uint64 {
	if m.quota.mode == fsnap.QuotaOff || !rec.DiskGroup {
		return nil
	}
	g, err := sandboxQgroup(rec.ID)
	if err != nil {
		return nil
	}
	return []uint64{g}
}

// groupsOfID is groupsOf for a sandbox known by ID only.
func (m *Manager) groupsOfID(id string) []uint64 {
	if m.quota.mode == fsnap.QuotaOff {
		return nil
	}
	var rec sandboxRec
	if err := m.db.Get(meta.Sandboxes, id, &rec); err != nil {
		return nil
	}
	return m.groupsOf(rec)
}

// dropQgroup deletes a removed sandbox's group. Its space is freed by
// the filesystem's cleaner after the deletions, and the group cannot go
// before: one that is still busy is left for the next start
// (sweepQgroups).
func (m *Manager) dropQgroup(rec sandboxRec) {
	if g := m.groupsOf(rec); g != nil {
		if err := fsnap.DestroyQgroup(m.pool.Dir, g[0]); err != nil {
			m.log.Debug("sandbox qgroup still busy; the next start removes it", "sandbox", rec.ID, "err", err)
		}
	}
}

// DiskUsage returns the bytes charged to the sandbox's qgroup, or -1
// without one.
func (m *Manager) diskUsage(rec sandboxRec) int64 {
	g := m.groupsOf(rec)
	if g == nil {
		return -1
	}
	n, err := fsnap.QgroupUsage(m.pool.Dir, g[0])
	if err != nil {
		return -1
	}
	return n
}

// regroup moves the subvolume root, made for sandbox from (a standby a
// fork adopts), into groups, the new sandbox's: what it writes from now
// on is charged to that sandbox. What it already holds moves with it.
func (m *Manager) regroup(root, from string, groups []uint64) error {
	if m.quota.mode == fsnap.QuotaOff {
		return nil
	}
	id, err := fsnap.SubvolumeID(root)
	if err != nil {
		return err
	}
	sub := fsnap.Qgroup(0, id)
	for _, g := range m.groupsOfID(from) {
		if err := fsnap.AssignQgroup(m.pool.Dir, sub, g, false); err != nil {
			return err
		}
	}
	for _, g := range groups {
		if err := fsnap.AssignQgroup(m.pool.Dir, sub, g, true); err != nil {
			return err
		}
	}
	return nil
}

// sweepQgroups deletes, at start-up, the groups of sandboxes that are
// gone (dropQgroup found them busy) once they are empty.
func (m *Manager) sweepQgroups(sbs []sandboxRec) {
	if m.quota.mode == fsnap.QuotaOff {
		return
	}
	live := map[uint64]bool{}
	for _, s := range sbs {
		if g, err := sandboxQgroup(s.ID); err == nil {
			live[g] = true
		}
	}
	gs, err := fsnap.Qgroups(m.pool.Dir, 1)
	if err != nil {
		m.log.Warn("cannot list the pool's qgroups", "err", err)
		return
	}
	for _, g := range gs {
		if !live[g] {
			_ = fsnap.DestroyQgroup(m.pool.Dir, g)
		}
	}
}

// headroom is what withHeadroom lends: a new inode and a reflink's
// metadata reservation (btrfs reserves up to 128 KiB of metadata per
// item against the groups' limits), or a copy of the init binary where
// reflinks fail.
const headroom = metaRoom

// withHeadroom runs f, the daemon's own writes into the root of sandbox
// rec (its init binary, stage 1's device nodes, its identity files),
// with the limits of its group and of all sandboxes raised by headroom:
// a sandbox at its quota, or sandboxes that filled their share of the
// pool, must not stop a rollback, a restart or a neighbour's fork. The
// lift lasts as long as f (milliseconds): running sandboxes could take at
// most headroom of the reserve's first half meanwhile, the half the
// daemon's work may use anyway, and the sandbox itself at most headroom
// past its quota, until it next frees space.
func (m *Manager) withHeadroom(rec sandboxRec, f func() error) error {
	g := m.groupsOf(rec)
	if g == nil {
		return f()
	}
	q := &m.quota
	q.mu.Lock()
	defer q.mu.Unlock()
	if used, err := fsnap.QgroupUsage(m.pool.Dir, sandboxesQgroup); err == nil {
		// The limit is at least used: the lift is from there.
		if s, err := m.pool.Space(); err == nil {
			limit := max(used+s.Avail()-m.reserve(), used) + headroom
			if fsnap.LimitQgroup(m.pool.Dir, sandboxesQgroup, limit) == nil {
				q.limit = limit
			}
		}
	}
	if q := rec.Resources.DiskBytes; q > 0 {
		if used, err := fsnap.QgroupUsage(m.pool.Dir, g[0]); err == nil {
			_ = fsnap.LimitQgroup(m.pool.Dir, g[0], max(q, used)+headroom)
		}
	}
	err := f()
	if q := rec.Resources.DiskBytes; q > 0 {
		if lerr := fsnap.LimitQgroup(m.pool.Dir, g[0], q); lerr != nil {
			m.log.Warn("cannot restore the sandbox's disk quota", "sandbox", rec.ID, "err", lerr)
		}
	}
	m.limitSandboxesLocked()
	return err
}
