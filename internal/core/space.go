package core

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/pool"
)

// Disk space. Work that writes to the pool checks for room first
// (m.room): a full pool, or a full filesystem under a loop pool, refuses
// the work with errdefs.ErrResourceExhausted before anything is frozen or
// written, and the sandbox runs on as it was. Work that runs out of space
// half-way (someone else filled the disk meanwhile) fails as any failed
// step does, and its error is marked resource-exhausted (m.exhausted).

// metaRoom is the room asked for work that writes metadata only
// (snapshots of a root, records): btrfs needs some for every snapshot.
const metaRoom = 16 << 20

// reserve is the space kept free in the pool.
func (m *Manager) reserve() int64 {
	switch {
	case m.cfg.DiskReservePercent > 0:
		s, err := m.pool.Space()
		if err != nil {
			return 0
		}
		return int64(float64(s.Size) * m.cfg.DiskReservePercent / 100)
	case m.cfg.DiskReserve < 0:
		return 0
	case m.cfg.DiskReserve > 0:
		return m.cfg.DiskReserve
	}
	s, err := m.pool.Space()
	if err != nil {
		return 0
	}
	return pool.DefaultReserve(s.Size)
}

// room refuses op when the pool (or the filesystem under a loop pool)
// would keep less than the reserve after need more bytes. With disk
// quotas the sandboxes' own writes are held out of the whole reserve
// (quota.go), and the daemon's work on any sandbox may then use the
// first half of it: a sandbox that filled the pool to its bound does not
// stop its neighbours' checkpoints. The last half is for metadata,
// commits and the filesystem holding molt.db.
func (m *Manager) room(op string, need int64) error {
	m.limitSandboxes(false)
	reserve := m.reserve()
	if m.quota.mode != fsnap.QuotaOff {
		reserve /= 2
	}
	if err := m.pool.Room(need+metaRoom, reserve); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// exhausted marks err, an error of no kind, as a lack of space when it
// is one: the kernel said
// so (ENOSPC, EDQUOT), or the pool is found short of its reserve now that
// the work failed (a CRIU or btrfs failure then rarely says why).
func (m *Manager) exhausted(err error) error {
	// An error of another kind already says what is wrong.
	if err == nil || errdefs.Kind(err) != nil {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w (out of disk space: %w)", err, errdefs.ErrResourceExhausted)
	}
	if rerr := m.pool.Room(0, metaRoom); errors.Is(rerr, errdefs.ErrResourceExhausted) {
		return fmt.Errorf("%w (%w)", err, rerr)
	}
	return err
}
