package core

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/keys"
	"github.com/molt-sh/molt/internal/meta"
	"golang.org/x/sys/unix"
)

// Encryption at rest of full checkpoints' images (docs/security.md,
// "Encryption at rest").
//
// With a KEK (molt daemon --kek-file), persist stores a full
// checkpoint's images sealed with its sandbox's tenant data key
// (ckstore, encrypt.go). CRIU and molt's own image readers read
// plaintext, so an encrypted checkpoint's images are decrypted into
// views in memory (one tmpfs of the daemon's, never the pool):
//
//   - the small images (every image but pages-*.img: the tree, cores,
//     memory maps, files) of a checkpoint, kept while the checkpoint is
//     in use (ckImages; a bounded number of checkpoints, the least
//     recently used dropped first);
//   - its page images, only while a restore holds them (openImages):
//     a warm or cold restore, a standby's preparation, a fork.
//
// The hot tier never decrypts on the critical path: a standby was
// restored (and its pages decrypted) when it was prepared.

// maxViews bounds the checkpoints whose small images are kept decrypted.
const maxViews = 64

type plainViews struct {
	mu sync.Mutex
	// +checklocks:mu
	dir string // the tmpfs, "" until first used
	// +checklocks:mu
	views map[string]*plainView
	// +checklocks:mu
	clock uint64
}

type plainView struct {
	tenant string
	mu     sync.Mutex
	// +checklocks:mu
	small bool // the small images are there
	// refs counts the restores holding the page images: changed under
	// mu, read without it by eviction (which must not wait for a
	// decryption under way).
	refs atomic.Int32
	// +checklocks:mu
	pages bool // the page images are there
	// +checklocks:mu
	linger *time.Timer // removes the pages once no restore came back for them
	used   uint64
	dir    string
}

// pagesLinger is how long decrypted page images outlive the last restore
// that held them: the next one often follows at once (a cold rollback's
// validation, then its restore; a rollback, then its standby), and
// decrypts nothing then.
const pagesLinger = 2 * time.Second

// dropPages removes the view's page images.
// +checklocks:pv.mu
func (pv *plainView) dropPages() {
	if pv.linger != nil {
		pv.linger.Stop()
		pv.linger = nil
	}
	removePages(pv.dir)
	pv.pages = false
}

// encrypting reports whether new full checkpoints are stored sealed.
func (m *Manager) encrypting() bool { return m.keys != nil && m.keys.Encrypting() }

// dataKeyOf is the key a full checkpoint of the sandbox rec is sealed
// with: its tenant's current one (nil when encryption is off).
func (m *Manager) dataKeyOf(rec sandboxRec) (*keys.DataKey, error) {
	if !m.encrypting() {
		return nil, nil
	}
	k, err := m.keys.Current(rec.Tenant)
	if err != nil {
		return nil, fmt.Errorf("data key of tenant %q: %w", rec.Tenant, err)
	}
	return k, nil
}

// viewsPrefix names this root's views tmpfs in /dev/shm: a restarted
// daemon removes what a crashed one left (reconcile).
func (m *Manager) viewsPrefix() string {
	return "molt-plain-" + strings.TrimPrefix(m.stagingPrefix(), "molt-dump-")
}

// viewsDir returns the tmpfs the views live in, mounting it on first
// use.
// +checklocks:v.mu
func (m *Manager) viewsDir(v *plainViews) (string, error) {
	if v.dir != "" {
		return v.dir, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return "", fmt.Errorf("decrypting checkpoint images needs a tmpfs at /dev/shm (they are never decrypted to disk): %w", errdefs.ErrNotSupported)
	}
	d, err := os.MkdirTemp("/dev/shm", m.viewsPrefix())
	if err != nil {
		return "", err
	}
	// Half the host's memory at most: pages are decrypted only for the
	// restores under way, each bounded by its sandbox's memory.
	var si unix.Sysinfo_t
	size := int64(1) << 30
	if unix.Sysinfo(&si) == nil {
		size = max(size, int64(si.Totalram)*int64(si.Unit)/2)
	}
	if err := unix.Mount("molt-plain", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
		fmt.Sprintf("size=%d,nr_inodes=1048576,mode=0700", size)); err != nil {
		os.Remove(d)
		return "", fmt.Errorf("mount a tmpfs for decrypted images: %w", err)
	}
	v.dir = d
	return d, nil
}

// view returns checkpoint ck's view, with its small images decrypted.
func (m *Manager) view(ck checkpointRec) (*plainView, error) {
	m.plain.mu.Lock()
	root, err := m.viewsDir(&m.plain)
	if err != nil {
		m.plain.mu.Unlock()
		return nil, err
	}
	if m.plain.views == nil {
		m.plain.views = map[string]*plainView{}
	}
	m.plain.clock++
	pv, ok := m.plain.views[ck.ID]
	if !ok {
		pv = &plainView{tenant: ck.KeyTenant, dir: filepath.Join(root, ck.ID)}
		m.plain.views[ck.ID] = pv
		m.evictViews()
	}
	pv.used = m.plain.clock
	m.plain.mu.Unlock()

	pv.mu.Lock()
	defer pv.mu.Unlock()
	if pv.small {
		return pv, nil
	}
	k, err := m.keys.Key(ck.KeyTenant, ck.DataKey)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", ck.ID, err)
	}
	_ = os.RemoveAll(pv.dir)
	if err := os.Mkdir(pv.dir, 0o700); err != nil {
		return nil, err
	}
	if _, err := m.cks.Reader(ck.ID).Decrypt(ck.Objects, k, pv.dir, func(n string) bool { return !isPageImage(n) }); err != nil {
		_ = os.RemoveAll(pv.dir)
		return nil, err
	}
	pv.small = true
	return pv, nil
}

// evictViews drops the least recently used views past maxViews that no
// restore holds.
// +checklocks:m.plain.mu
func (m *Manager) evictViews() {
	for len(m.plain.views) > maxViews {
		var oldest string
		var at uint64
		for id, pv := range m.plain.views {
			if pv.refs.Load() == 0 && (oldest == "" || pv.used < at) {
				oldest, at = id, pv.used
			}
		}
		if oldest == "" {
			return
		}
		// A linger timer of it finds the directory gone.
		_ = os.RemoveAll(m.plain.views[oldest].dir)
		delete(m.plain.views, oldest)
	}
}

// dropViews removes the views of the checkpoints drop accepts (deleted
// checkpoints, a shredded tenant's) that no restore holds.
func (m *Manager) dropViews(drop func(id, tenant string) bool) {
	m.plain.mu.Lock()
	defer m.plain.mu.Unlock()
	for id, pv := range m.plain.views {
		if !drop(id, pv.tenant) {
			continue
		}
		pv.mu.Lock()
		if pv.refs.Load() == 0 {
			pv.dropPages()
			_ = os.RemoveAll(pv.dir)
			pv.small = false
			delete(m.plain.views, id)
		}
		pv.mu.Unlock()
	}
}

func isPageImage(name string) bool {
	return strings.HasPrefix(name, "pages-") && strings.HasSuffix(name, ".img")
}

// ckImages is the directory of checkpoint ck's images to read: its own
// in the pool, or for a sealed one its view (the small images only:
// what molt's own readers need; openImages adds the pages for a
// restore). A view that cannot be made (the key shredded) is logged and
// its directory left empty: readers then find no images, and a restore
// fails in openImages with the reason.
func (m *Manager) ckImages(id string) string {
	var ck checkpointRec
	if m.db.Get(meta.Checkpoints, id, &ck) != nil || ck.DataKey == "" {
		return m.cks.Images(id)
	}
	pv, err := m.view(ck)
	if err != nil {
		m.log.Warn("cannot decrypt a checkpoint's images", "checkpoint", id, "err", err)
		return filepath.Join(m.path("tmp"), "no-images-"+id)
	}
	return pv.dir
}

// openImages returns the directory a restore of checkpoint ck reads
// every image from, and the function that ends its use: the pool's, or
// a sealed checkpoint's view with its pages decrypted until the last
// restore holding them ends.
func (m *Manager) openImages(ck checkpointRec) (string, func(), error) {
	if ck.DataKey == "" {
		return m.cks.Images(ck.ID), func() {}, nil
	}
	pv, err := m.view(ck)
	if err != nil {
		return "", nil, err
	}
	pv.mu.Lock()
	defer pv.mu.Unlock()
	// The key is checked by every restore, even one that finds the pages
	// decrypted by another: a shredded key ends them all.
	k, err := m.keys.Key(ck.KeyTenant, ck.DataKey)
	if err != nil {
		return "", nil, fmt.Errorf("checkpoint %s: %w", ck.ID, err)
	}
	if pv.linger != nil {
		pv.linger.Stop()
		pv.linger = nil
	}
	if !pv.pages {
		removePages(pv.dir)
		if _, err := m.cks.Reader(ck.ID).Decrypt(ck.Objects, k, pv.dir, isPageImage); err != nil {
			removePages(pv.dir)
			return "", nil, err
		}
		pv.pages = true
	}
	pv.refs.Add(1)
	var once sync.Once
	return pv.dir, func() {
		once.Do(func() {
			pv.mu.Lock()
			defer pv.mu.Unlock()
			if pv.refs.Add(-1) != 0 {
				return
			}
			if m.keyAlive(ck) != nil {
				// Shredded meanwhile: nothing of it stays.
				pv.dropPages()
				_ = os.RemoveAll(pv.dir)
				pv.small = false
				return
			}
			pv.linger = time.AfterFunc(pagesLinger, func() {
				pv.mu.Lock()
				defer pv.mu.Unlock()
				if pv.refs.Load() == 0 {
					pv.dropPages()
				}
			})
		})
	}, nil
}

func removePages(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if isPageImage(e.Name()) {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// closeViews unmounts the views' tmpfs (the daemon stops).
func (m *Manager) closeViews() {
	m.plain.mu.Lock()
	defer m.plain.mu.Unlock()
	if m.plain.dir != "" {
		removeStaging(m.plain.dir)
		m.plain.dir, m.plain.views = "", nil
	}
}

// DataKeys describes the host's data keys (never their material).
func (m *Manager) DataKeys() ([]keys.KeyInfo, error) { return m.keys.List() }

// RotateDataKey makes a new data key tenant's current one: its new
// checkpoints are sealed with it, those before stay readable with the
// old one (nothing is rewritten).
func (m *Manager) RotateDataKey(tenant string) (keys.KeyInfo, error) {
	if err := m.tenantExists(tenant); err != nil {
		return keys.KeyInfo{}, err
	}
	k, err := m.keys.Rotate(tenant)
	if err != nil {
		return keys.KeyInfo{}, err
	}
	return keys.KeyInfo{Tenant: tenant, ID: k.ID, KEK: m.keys.KEKID(), Current: true}, nil
}

// ShredDataKeys deletes every data key of tenant: its sealed
// checkpoints, turn logs and ledgers can never be read again (a deleted
// tenant's are shredded so). Their
// decrypted views and the standbys restored from them (live copies of
// the shredded state) go too. It returns how many keys went.
func (m *Manager) ShredDataKeys(tenant string) (int, error) {
	n, err := m.keys.Shred(tenant)
	if err != nil {
		return n, err
	}
	m.dropViews(func(_, t string) bool { return t == tenant })
	// Standbys being restored find the key gone before they are kept
	// (prepare) and any kept is checked again when promoted; these go
	// now.
	sbs, err := meta.SandboxRecords.List(m.db)
	if err != nil {
		return n, err
	}
	for _, sb := range sbs {
		if sb.Tenant == tenant {
			m.dropStandby(sb.ID, true)
		}
	}
	return n, nil
}

// keyAlive checks that the data key of checkpoint ck (if sealed) is
// still there: after a shredding nothing of the state it sealed is
// restored, not even from a standby.
func (m *Manager) keyAlive(ck checkpointRec) error {
	if ck.DataKey == "" {
		return nil
	}
	if _, err := m.keys.Key(ck.KeyTenant, ck.DataKey); err != nil {
		return fmt.Errorf("checkpoint %s: %w", ck.ID, err)
	}
	return nil
}

// tenantExists refuses a tenant that is neither the host's ("") nor one
// of its tenants.
func (m *Manager) tenantExists(tenant string) error {
	if tenant == "" {
		return nil
	}
	var t meta.TenantRecord
	if err := m.db.Get(meta.Tenants, tenant, &t); err != nil {
		return fmt.Errorf("tenant %q: %w", tenant, errdefs.ErrNotFound)
	}
	return nil
}
