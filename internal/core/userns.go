package core

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/ns"
	"github.com/molt-sh/molt/internal/sandbox"
)

// User namespaces (Config.UserNS; docs/architecture.md, "User
// namespaces"): a sandbox created while they are on gets a block of
// UserNSSize host uids and gids, the first free one from
// Config.UserNSBase, recorded in its record (sandboxRec.IDs). Root inside
// is the block's first id. A full checkpoint records the block its
// images map (CRIU recreates the namespace with the dumped maps), and a
// restore of it gives the sandbox that block: a fork from a full
// checkpoint shares its origin's block, a fresh start (create, restart,
// fs fork) keeps or gets one of its own. A block is free when no
// sandbox record names it.

// DefaultUserNSBase is the first host uid of the blocks: above the
// ranges distributions hand out to their users' subordinate ids
// (/etc/subuid from 100000, 65536 each) for the first 13,000 users, and
// leaving (2^32 - base) / 65536, about 50,000 blocks.
const DefaultUserNSBase = 1 << 30

// UserNSSize is the size of one sandbox's block: every 16-bit id, as a
// Debian image's users and groups expect.
const UserNSSize = ckstore.UserNSSize

// idBlocks hands out blocks to sandboxes being made: a block is
// pending (by sandbox ID) until the sandbox's record names it, or until
// the sandbox is not made after all.
type idBlocks struct {
	mu      sync.Mutex
	pending map[uint32]string // +checklocks:mu
}

// allocIDs reserves the first free block for sandbox id; release gives it
// back if the sandbox is not made.
func (m *Manager) allocIDs(id string) (ids sandbox.IDRange, release func(), err error) {
	base := m.cfg.UserNSBase
	if base == 0 {
		base = DefaultUserNSBase
	}
	m.idBlocks.mu.Lock()
	defer m.idBlocks.mu.Unlock()
	sbs, err := meta.List[sandboxRec](m.db, meta.Sandboxes)
	if err != nil {
		return ids, nil, err
	}
	used := map[uint32]bool{}
	recorded := map[string]bool{}
	for _, s := range sbs {
		recorded[s.ID] = true
		if s.IDs.Enabled() {
			used[s.IDs.Base] = true
		}
	}
	if m.idBlocks.pending == nil {
		m.idBlocks.pending = map[uint32]string{}
	}
	for b, owner := range m.idBlocks.pending {
		if recorded[owner] {
			delete(m.idBlocks.pending, b)
		} else {
			used[b] = true
		}
	}
	for b := uint64(base); b+UserNSSize <= 1<<32-1; b += UserNSSize {
		if used[uint32(b)] {
			continue
		}
		m.idBlocks.pending[uint32(b)] = id
		return sandbox.IDRange{Base: uint32(b), Size: UserNSSize}, func() {
			m.idBlocks.mu.Lock()
			if m.idBlocks.pending[uint32(b)] == id {
				delete(m.idBlocks.pending, uint32(b))
			}
			m.idBlocks.mu.Unlock()
		}, nil
	}
	return ids, nil, fmt.Errorf("no free block of %d host ids from %d for a user namespace: %w", UserNSSize, base, errdefs.ErrResourceExhausted)
}

// criuRoot returns the root CRIU restores the tree of ck onto: root
// itself, or for a checkpoint whose images hold a user namespace, root
// mounted idmapped to its block on a directory of its own (the restored
// tree keeps its copy of the mount). Call done once CRIU is finished.
func (m *Manager) criuRoot(ck checkpointRec, root string) (string, func(), error) {
	if !ck.IDs.Enabled() {
		return root, func() {}, nil
	}
	// CRIU reads images from the tasks it restores, some once they are
	// the namespace's root, an unprivileged host uid: the images must
	// be readable to it. Their parents stay the daemon's (0700).
	if err := ownImages(m.ckImages(ck.ID), ck.IDs); err != nil {
		return "", nil, err
	}
	dir := m.path("tmp", "idmap-"+newID())
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", nil, err
	}
	unmount, err := sandbox.MountIDMapped(m.launcher.Binary, root, dir, ck.IDs)
	if err != nil {
		os.Remove(dir)
		return "", nil, err
	}
	return dir, func() {
		if err := unmount(); err != nil {
			m.log.Error("unmount a restore's idmapped root", "dir", dir, "err", err)
			return
		}
		os.Remove(dir)
	}, nil
}

// ownImages lets the group of r's first id read the images directory dir
// and the files in it (owner host root, mode 0640, the directory 0750).
// A restoring task opens images both before and after it becomes the
// namespace's root (host uid 0, then r.Base): it must read them as
// either.
func ownImages(dir string, r sandbox.IDRange) error {
	own := func(p string, dir bool) error {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return nil
		}
		mode := uint32(0o640)
		if dir {
			mode = 0o750
		}
		if st.Uid != 0 || st.Gid != r.Base {
			if err := unix.Lchown(p, 0, int(r.Base)); err != nil {
				return err
			}
		}
		if st.Mode&0o7777 != mode {
			return unix.Chmod(p, mode)
		}
		return nil
	}
	if err := own(dir, true); err != nil {
		return fmt.Errorf("images for a user namespace: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("images for a user namespace: %w", err)
	}
	for _, e := range ents {
		if err := own(filepath.Join(dir, e.Name()), e.IsDir()); err != nil {
			return fmt.Errorf("images for a user namespace: %w", err)
		}
	}
	return nil
}

// lowPortsFor lets every user of pid's network namespace bind ports below
// 1024. A sandbox with a user namespace owns the network namespace it
// starts in, so its root binds them; a restore puts the tree in a fresh
// one of the host's (CRIU's, left out of the images), where that takes a
// capability the sandbox does not hold over it. The namespace is the
// sandbox's alone, loopback only.
func lowPortsFor(pid int) error {
	return ns.DoPid(pid, unix.CLONE_NEWNET, func() error {
		// /proc/sys/net is the reading thread's network namespace's.
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_unprivileged_port_start", []byte("0"), 0); err != nil {
			return fmt.Errorf("low ports in the restored network namespace: %w", err)
		}
		return nil
	})
}
