package core

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/egress"
	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/hot"
	"github.com/molt-sh/molt/internal/keys"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/objstore"
	"github.com/molt-sh/molt/internal/pid1"
	"github.com/molt-sh/molt/internal/pool"
	"github.com/molt-sh/molt/internal/remote"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/sched"
	"github.com/molt-sh/molt/internal/secret"
	"github.com/molt-sh/molt/internal/turn"
	"golang.org/x/sys/unix"
)

// Config configures a Manager.
type Config struct {
	// Root is the state root (metadata, pool).
	Root string
	// PoolSize is the size of the loop file when Root is not on btrfs.
	PoolSize int64
	// PoolNodeSize is the btrfs node size of a new loop file (0:
	// pool.DefaultNodeSize).
	PoolNodeSize int
	// CacheDir caches debootstrap trees between pools.
	CacheDir string
	// InitBinary is the host binary holding molt's stage 1 (sandbox
	// setup, which then executes pid1); default the running executable.
	InitBinary string
	// CriuPath is the criu command; "" finds the one scripts/criu.sh
	// installs (/opt/molt/criu/bin/criu), then criu on PATH. Without
	// one, full checkpoints are reported unsupported.
	CriuPath string
	// RecordLimit bounds each sandbox's recorded command output and LLM
	// exchanges (the turn log a recovery replays) unless the sandbox
	// sets its own; 0: turn.DefaultRecordLimit.
	RecordLimit int64
	// Redact are regular expressions of credentials redacted from the
	// turn log and the ledgers, beyond secret.DefaultPatterns.
	Redact []string
	// StandbyBudget bounds the memory of pre-restored standbys (by the
	// size of their checkpoints' images) across the host; 0 disables
	// standbys, so every rollback restores with CRIU.
	StandbyBudget int64
	// SandboxStandbyBudget is the default bound of one sandbox's
	// standbys, for sandboxes created without their own
	// (meta.Resources.StandbyBudgetBytes); 0 leaves them bounded by
	// StandbyBudget only.
	SandboxStandbyBudget int64
	// DefaultResources are the limits of a sandbox created without its
	// own (meta.Resources fields left 0). A field left 0 here takes molt's
	// default (DefaultMemory, DefaultPids, DefaultCPUMillis; no I/O
	// weight); -1 means no limit.
	DefaultResources meta.Resources
	// CRIULogLevel is the log level of CRIU's dumps and restores (1
	// errors, 2 and warnings, 3 and information, 4 and debugging); 0
	// means DefaultCRIULogLevel. Errors are quoted from the log either
	// way; level 4 logs about 1,900 lines for an idle session and adds
	// 3-5 ms to the frozen window of its checkpoint (measured), so it is
	// for debugging.
	CRIULogLevel int
	// Version is reported by Host.
	Version string
	// Sched configures the host-wide scheduler of checkpoint background
	// work (persisting, standby preparation, GC); see internal/sched.
	Sched sched.Config
	// DiskReserve is the space kept free in the pool, and under a loop
	// pool: work that would leave less (a checkpoint, a fork, a
	// rollback) is refused with errdefs.ErrResourceExhausted before it
	// starts. 0 means pool.DefaultReserve; negative, no reserve.
	DiskReserve int64
	// DiskReservePercent, when above 0, sets the reserve to that
	// percentage of the pool's size instead.
	DiskReservePercent float64
	// DefaultDisk is the disk quota of a sandbox created without one
	// (meta.Resources.DiskBytes 0): its root and checkpoints together
	// (quota.go). 0: none, the sandboxes then share the pool less the
	// reserve.
	DefaultDisk int64
	// FrozenDeadline bounds each frozen window of a capture (capture.Watch);
	// 0 means DefaultFrozenDeadline, negative none.
	FrozenDeadline time.Duration
	// SeccompDefault is the filter of sandboxes created without one:
	// v1.SeccompDefault ("" too) or v1.SeccompUnconfined.
	SeccompDefault string
	// TrustedKeys are files of public keys (ckstore.EncodePublicKey)
	// whose signed checkpoints this host restores, besides its own key
	// (Root/keys/host.key, made on first start) and Root/keys/trusted.
	TrustedKeys []string
	// KEK, if set, turns encryption at rest on: tenants' data keys are
	// wrapped by it (internal/keys). PreviousKEK is the one it replaces:
	// keys wrapped by that one are re-wrapped at start (a rotation).
	KEK, PreviousKEK keys.KEK
	// Logger; default slog.Default().
	Logger *slog.Logger
	// UserNS gives each sandbox created from now on a user namespace:
	// root inside is a block of UserNSSize unprivileged host ids from
	// UserNSBase (0: DefaultUserNSBase), see userns.go. Sandboxes keep
	// what they were created with either way.
	UserNS     bool
	UserNSBase uint32
	// Egress configures sandboxes' way out (egress.go).
	Egress EgressConfig
	// Store, if set, is the object store checkpoints are uploaded to
	// and fetched from (offload.go; docs/storage.md).
	Store objstore.Bucket
	// CgroupParent is the cgroup (in every hierarchy) sandboxes' cgroups
	// are made in; "" is "molt". Two daemons on one machine (tests,
	// benchmarks of several hosts) need parents of their own.
	CgroupParent string
	// StoreCache bounds the local copies of checkpoints that are in the
	// store: beyond it, the least recently used are freed (fetched back
	// when a restore needs them). 0 keeps them all.
	StoreCache int64
}

// DefaultCRIULogLevel is Config.CRIULogLevel's default: errors and
// warnings.
const DefaultCRIULogLevel = 2

// criuLogLevel is the log level of CRIU's dumps and restores.
func (m *Manager) criuLogLevel() int {
	if m.cfg.CRIULogLevel == 0 {
		return DefaultCRIULogLevel
	}
	return m.cfg.CRIULogLevel
}

// Manager owns the pool, the metadata and every sandbox of one root.
type Manager struct {
	cfg      Config
	commits  commitGate
	pool     *pool.Pool
	db       *meta.DB
	ix       indexes // over db's records (records.go)
	launcher *sandbox.Launcher
	initBin  string // pool copy of the init binary
	kernel   string // kernel release, recorded in manifests
	criu     *criu.Tool
	log      *slog.Logger
	started  time.Time
	net      *egress.Host   // sandboxes' egress (egress.go)
	ledger   *ledger.Ledger // every sandbox's effects
	netMu    sync.Mutex     // address allocation
	compWG   sync.WaitGroup // compensations resumed at start-up (compensate.go)
	// The store's workers: the one deleting from the store what removed
	// checkpoints and sandboxes had there (storedrop.go), and the one
	// indexing images ahead of resumes (indexImages).
	dropWG sync.WaitGroup
	// indexQ queues images for the store to index ahead (indexImages);
	// nil without a store. Set before Open returns.
	indexQ   chan string
	dropWake chan struct{}

	idBlocks idBlocks // user namespace blocks being handed out

	mu    sync.Mutex             // guards locks, copying and name uniqueness checks
	locks map[string]*sync.Mutex // +checklocks:mu
	// copying holds, per sandbox, the end of the dumps of a template
	// capture's copies (internal/capture), closed when they are done: until
	// then the copies are processes of the sandbox.
	copying map[string]chan struct{} // +checklocks:mu

	inflight inflight // open daemon connections to each sandbox's init

	sby       *hot.Standbys  // pre-restored standbys (standby.go)
	spr       *hot.Spares    // started CRIUs for the next restore or dump, per sandbox
	lim       rooms          // room in sandboxes' limits for the daemon's processes (limits.go)
	ret       *hot.Retired   // roots rollbacks replaced, not yet deleted
	tko       *hot.Takeovers // records of switches of sandboxes' live trees
	pipe      pipeline       // pending full checkpoints
	turns     *turn.Tracker
	sch       *sched.Scheduler // nil WithoutScheduler
	captures  chan struct{}    // capture slots (captureSlot); nil WithoutScheduler
	closing   chan struct{}    // closed when Close begins
	closeOnce sync.Once
	metrics   *metrics

	dynModsSets atomic.Int64 // times this manager set favordynmods

	streamMu sync.Mutex
	// Pipes for streamed dumps (pipePool)
	pipes *criu.PipePool // +checklocks:streamMu

	disk *meta.Copies // on-disk copies of the records (internal/meta/copies.go)

	quota quotaState // the pool's disk quotas (quota.go)

	cks *ckstore.Store // the checkpoint artifacts, in pool/checkpoints
	// store is the object store of Config.Store, nil without one.
	store   *remote.Store
	fetchMu sync.Mutex // one fetch from the store at a time
	lazyMu  sync.Mutex
	// lazies are the lazy fetches under way (lazy.go).
	// +checklocks:lazyMu
	lazies   map[*lazyFetch]bool
	uploadMu sync.Mutex // one upload to the store at a time
	usedMu   sync.Mutex
	used     map[string]time.Time // +checklocks:usedMu
	// keys are the tenants' data keys (Root/keys/data): encryption at
	// rest when a KEK was given, sealed secrets always (internal/keys).
	keys *keys.Ring
	// plain are the decrypted views of sealed checkpoints' images
	// (encrypt.go).
	plain plainViews
	// vault redacts and seals the turn log and the ledgers (secrets.go);
	// tenants remembers the tenant of sandboxes not yet recorded.
	vault   *secret.Vault
	tenants sync.Map

	opts  options // the optimizations switched off (options.go)
	hooks hooks   // set by tests only (hooks.go)
}

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

func validName(kind, name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%s name %q: want 1-63 characters of letters, digits, '.', '_', '-', starting with a letter or digit: %w", kind, name, errdefs.ErrInvalidArgument)
	}
	return nil
}

func newID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Open opens the state root: mounts the pool, opens the metadata, and
// reconciles what is on disk with what is recorded. opts switch
// optimizations off, for comparisons.
func Open(ctx context.Context, cfg Config, opts ...Option) (*Manager, error) {
	if cfg.Root == "" {
		return nil, fmt.Errorf("state root not set: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = "/var/cache/molt"
	}
	if cfg.InitBinary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own binary: %w", err)
		}
		cfg.InitBinary = exe
	}
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, err
	}
	db, err := meta.OpenRecords(filepath.Join(cfg.Root, "molt.db"), cfg.Logger)
	if err != nil {
		return nil, err
	}
	ix, err := addIndexes(db)
	if err != nil {
		db.Close()
		return nil, err
	}
	p, err := pool.Open(ctx, pool.Config{Root: cfg.Root, Size: cfg.PoolSize, NodeSize: cfg.PoolNodeSize})
	if err != nil {
		db.Close()
		return nil, err
	}
	m := &Manager{
		cfg: cfg, pool: p, db: db, ix: ix, log: cfg.Logger, started: time.Now(),
		launcher: &sandbox.Launcher{Binary: cfg.InitBinary},
		locks:    map[string]*sync.Mutex{},
		copying:  map[string]chan struct{}{},
		closing:  make(chan struct{}),
		dropWake: make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(&m.opts)
	}
	m.turns = m.newTurns()
	m.cks = ckstore.New(ckstore.NewLocal(m.path("checkpoints")))
	signing, err := ckstore.LoadKeyring(filepath.Join(cfg.Root, "keys"), cfg.TrustedKeys)
	if err != nil {
		return nil, fmt.Errorf("checkpoint signing keys: %w", err)
	}
	m.cks.SetKeyring(signing)
	if cfg.Store != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		m.store, err = remote.Open(sctx, cfg.Store, signing)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	if m.keys, err = keys.OpenRing(filepath.Join(cfg.Root, "keys", "data"), cfg.KEK, cfg.PreviousKEK); err != nil {
		return nil, fmt.Errorf("data keys: %w", err)
	}
	if m.vault, err = m.newVault(); err != nil {
		return nil, err
	}
	m.turns.SetVault(m.vault)
	m.openHot()
	m.metrics = newMetrics(m)
	if !m.opts.noScheduler {
		m.captures = make(chan struct{}, max(1, runtime.NumCPU()))
		m.sch = sched.New(cfg.Sched)
		if err := m.sch.Register(m.metrics.reg); err != nil {
			return nil, err
		}
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		m.kernel = unix.ByteSliceToString(uts.Release[:])
	}
	for _, d := range []string{"images", "sandboxes", "checkpoints", "tmp", "bin"} {
		if err := os.MkdirAll(m.path(d), 0o700); err != nil {
			m.Close()
			return nil, err
		}
	}
	m.disk = m.db.KeepCopies(m.metaDisk())
	m.setupQuota()
	if p := findCriu(cfg.CriuPath); p != "" {
		m.criu = criu.New(p)
		// CRIU re-probes the kernel on every call (30-40 ms) unless it
		// finds its cache at /run/criu.kdat; keep one on a small tmpfs.
		if err := m.criu.CacheKerndat(ctx, KerndatDir); err != nil {
			m.log.Warn("criu kernel-probe cache unavailable; every CRIU call probes the kernel", "err", err)
		}
		// Probe now (memoized): the self-test proves CRIU works here
		// before the first checkpoint needs it.
		if f := m.criu.Probe(ctx); criuProblem(f) != "" {
			m.log.Warn("full checkpoints unavailable", "criu", p, "reason", criuProblem(f))
		}
	}
	m.favorDynMods()
	if err := m.openEgress(); err != nil {
		m.Close()
		return nil, err
	}
	if m.initBin, err = m.installInitBinary(); err != nil {
		m.Close()
		return nil, err
	}
	if err := m.reconcile(ctx); err != nil {
		m.Close()
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	m.resumeCompensations()
	m.startDrops()
	m.indexImages()
	return m, nil
}

// Close releases the metadata store after standby preparations in
// flight end, and kills the standbys. Sandboxes keep running, and the
// pool stays mounted for them.
func (m *Manager) Close() error {
	// Turn ends and baselines in the background first: a turn end may
	// still add a pending checkpoint to the pipeline.
	m.turns.Close()
	m.pipe.wg.Wait()
	m.closeOnce.Do(func() { close(m.closing) })
	m.closeLazy()
	if m.sch != nil {
		// Queued standby and GC jobs are dropped (start-up removes what
		// GC would have); running ones end first.
		m.sch.Close()
	}
	// Spares first (their refills end), then the standbys' waiters and
	// the standbys themselves, whose rooms go before the limits' waiters
	// are waited for.
	m.spr.Close()
	m.sby.Close()
	m.lim.wg.Wait()
	m.streamMu.Lock()
	if m.pipes != nil {
		m.pipes.Close()
	}
	m.streamMu.Unlock()
	m.ret.Close()
	m.quota.wg.Wait()
	m.disk.Close()
	m.compWG.Wait()
	m.dropWG.Wait()
	if c, ok := m.cfg.Store.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
	m.closeEgress()
	m.closeViews()
	m.releaseInits()
	return m.db.Close()
}

// releaseInits lets go of the agents this process keeps for its
// sandboxes' inits, once nothing of the manager runs: a call under way
// ends, and the sessions run on for the next daemon. An agent left
// behind would go on reading the sessions' output, and a daemon started
// after this one (a restart in the same process, or in a test) would
// lose the markers it waits for to whichever agent read them first.
func (m *Manager) releaseInits() {
	recs, err := meta.List[sandboxRec](m.db, meta.Sandboxes)
	if err != nil {
		return
	}
	for _, r := range recs {
		sandbox.Forget(r.Init)
	}
}

// Pool returns the storage pool.
func (m *Manager) Pool() *pool.Pool { return m.pool }

func (m *Manager) path(elem ...string) string {
	return filepath.Join(append([]string{m.pool.Dir}, elem...)...)
}

// lock serializes lifecycle operations on one object: it returns holding
// the object's lock, and the function that releases it (a hand-off the
// analyzer cannot follow).
//
// +checklocksignore
func (m *Manager) lock(id string) func() {
	m.mu.Lock()
	l, ok := m.locks[id]
	if !ok {
		l = &sync.Mutex{}
		m.locks[id] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// installInitBinary writes pid1 into the pool once per distinct build,
// so sandbox roots get it by reflink.
func (m *Manager) installInitBinary() (string, error) {
	bin := pid1.Binary()
	sum := sha256.Sum256(bin)
	dst := m.path("bin", "pid1-"+hex.EncodeToString(sum[:])[:16])
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	tmp := dst + ".tmp"
	_ = os.Remove(tmp)
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return "", fmt.Errorf("init binary: %w", err)
	}
	if _, err := out.Write(bin); err != nil {
		out.Close()
		return "", fmt.Errorf("init binary: %w", err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return "", fmt.Errorf("init binary: %w", err)
	}
	out.Close()
	return dst, os.Rename(tmp, dst)
}

// removeTree deletes path, which may be a subvolume, a directory holding
// subvolumes, or missing.
func removeTree(path string) error { return fsnap.RemoveTree(path) }

// reconcile makes disk and metadata agree after a crash or restart.
func (m *Manager) reconcile(ctx context.Context) error {
	ents, _ := os.ReadDir(m.path("tmp"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "idmap-") {
			// A restore's idmapped root (userns.go) the crash left
			// mounted: its files are a sandbox's, never staging.
			if err := unix.Unmount(m.path("tmp", e.Name()), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				m.log.Warn("cannot unmount the idmapped root a previous daemon left; set aside", "path", e.Name(), "err", err)
			}
		}
		m.removeOrSetAside(m.path("tmp", e.Name()), "staging-"+e.Name(), "staging a previous daemon left")
	}
	m.removeStaleStaging()
	// A database that was lost, emptied or set aside as corrupt is
	// rebuilt from the records on disk first (meta.DB.Rebuild).
	if m.db.Fresh() {
		if err := m.db.Rebuild(m.metaDisk()); err != nil {
			return err
		}
	}
	cks, err := meta.List[checkpointRec](m.db, meta.Checkpoints)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	var listed []checkpointRec
	for _, c := range cks {
		known[c.ID] = true
		if _, err := os.Stat(m.ckFS(c.ID)); err != nil {
			m.log.Warn("checkpoint lost its files; dropping record", "checkpoint", c.ID, "err", err)
			if err := m.db.Delete(meta.Checkpoints, c.ID); err != nil {
				return err
			}
			continue
		}
		listed = append(listed, c)
	}
	// What the metadata does not list is removed only when it shows it
	// never committed; anything else is quarantined.
	ents, _ = os.ReadDir(m.path("checkpoints"))
	for _, e := range ents {
		if !known[e.Name()] {
			m.unlistedCheckpoint(e.Name())
		}
	}
	sbs, err := meta.List[sandboxRec](m.db, meta.Sandboxes)
	if err != nil {
		return err
	}
	if err := m.finishTakeovers(ctx, sbs); err != nil {
		return err
	}
	known = map[string]bool{}
	for _, s := range sbs {
		known[s.ID] = true
	}
	for _, s := range sbs {
		// A head that names a checkpoint a crash kept from committing.
		if s.Head != "" {
			var c checkpointRec
			if err := m.db.Get(meta.Checkpoints, s.Head, &c); err != nil {
				m.log.Warn("head names an uncommitted checkpoint; clearing it", "sandbox", s.ID, "checkpoint", s.Head)
				// It was reported pending: listed as failed, not dropped.
				m.recordFailed(checkpointRec{Checkpoint: meta.Checkpoint{ID: s.Head, Sandbox: s.ID, Kind: v1.KindFull}}, errors.New("the daemon stopped before it was stored"))
				s.Head = ""
				if err := m.db.Put(meta.Sandboxes, s.ID, s); err != nil {
					return err
				}
			}
		}
		m.killStrays(s)
		// A daemon that died inside a checkpoint may have left the
		// sandbox frozen, and its PID 1 stopped (SIGSTOP, while the
		// tree's memory was write-protected: see protect). Nothing else
		// stops PID 1: from inside its namespace SIGSTOP does not reach
		// it.
		if cg, err := cgroup.Load(m.cgroupName(s.ID)); err == nil {
			if err := cg.Thaw(); err != nil {
				m.log.Warn("cannot thaw sandbox", "sandbox", s.ID, "err", err)
			}
			// A sandbox that is not running has no processes: stop and
			// hibernate write their record before they kill the tree,
			// and a crash in between leaves the tree to this.
			if s.State == v1.StateStopped || s.State == v1.StateHibernated {
				if pids, _ := cg.Pids(); len(pids) > 0 {
					m.log.Warn("killing the processes a crash left in a sandbox that is not running", "sandbox", s.ID, "state", s.State, "processes", len(pids))
					if err := cg.Kill(ctx); err != nil {
						m.log.Warn("cannot kill the processes of a sandbox that is not running", "sandbox", s.ID, "err", err)
					}
				}
			}
		}
		m.endLazyFetch(ctx, s)
		_ = s.Init.Signal(unix.SIGCONT)
	}
	ents, _ = os.ReadDir(m.path("sandboxes"))
	for _, e := range ents {
		if !known[e.Name()] {
			m.unlistedSandbox(ctx, e.Name())
		}
	}
	if sbs, err = meta.List[sandboxRec](m.db, meta.Sandboxes); err != nil {
		return err
	}
	m.disk.Heal(sbs, listed)
	m.sweepQgroups(sbs)
	m.reconcileEgress(sbs)
	return nil
}

// removeStaleStaging removes the dump staging and the decrypted views in
// /dev/shm that a crashed daemon left.
func (m *Manager) removeStaleStaging() {
	// Dump staging a crashed daemon left: this root's at once (this
	// daemon holds the root), other roots' once stale (a live dump never
	// takes minutes).
	stale, _ := filepath.Glob("/dev/shm/molt-dump-*")
	for _, d := range stale {
		own := strings.HasPrefix(filepath.Base(d), m.stagingPrefix())
		if fi, err := os.Stat(d); err == nil && (own || time.Since(fi.ModTime()) > 10*time.Minute) {
			removeStaging(d)
		}
	}
	// Decrypted views a crashed daemon of this root left (encrypt.go);
	// only this root's: another root's daemon keeps its own for as long
	// as it runs.
	views, _ := filepath.Glob("/dev/shm/" + m.viewsPrefix() + "*")
	for _, d := range views {
		removeStaging(d)
	}
}

// Host reports the host, the pool and the features molt has here.
func (m *Manager) Host() meta.Host {
	h := meta.Host{
		Version: m.cfg.Version,
		Kernel:  m.kernel,
		Root:    m.cfg.Root,
		Pool:    meta.Pool{Dir: m.pool.Dir, Loop: m.pool.Loop, Backing: m.pool.Backing, Device: m.pool.Device, NodeSize: m.pool.NodeSize},
		Cgroup:  cgroup.Mode(),
		Started: m.started,
	}
	if k := m.cks.Keyring(); k != nil {
		h.KeyID, h.PublicKey, h.TrustedKeys = k.KeyID(), string(k.PublicKey()), k.Trusted()
	}
	var st unix.Statfs_t
	if unix.Statfs(m.pool.Dir, &st) == nil {
		h.Pool.SizeBytes = st.Blocks * uint64(st.Bsize)
		h.Pool.FreeBytes = st.Bavail * uint64(st.Bsize)
	}
	if sbs, err := meta.List[sandboxRec](m.db, meta.Sandboxes); err == nil {
		h.Sandboxes = len(sbs)
	}
	h.Features = []meta.Feature{
		{Name: "btrfs-pool", Supported: true, Detail: poolDetail(m.pool)},
		{Name: "fs-checkpoint", Supported: true, Detail: "btrfs snapshot ioctl under a cgroup freeze"},
		m.quotaFeature(),
		{Name: "cgroup", Supported: true, Detail: cgroup.Mode()},
		m.criuFeature(),
		inspectorFeature(),
		m.dynModsFeature(),
		m.egressFeature(),
		{Name: "arch", Supported: true, Detail: runtime.GOARCH},
	}
	return h
}

func inspectorFeature() meta.Feature {
	if ok, why := turn.InspectorStatus(); !ok {
		return meta.Feature{Name: "inspector", Reason: why + " (turns are then always full)"}
	}
	return meta.Feature{Name: "inspector", Supported: true, Detail: "eBPF on raw_syscalls and sched tracepoints, per sandbox cgroup and PID namespace"}
}

// KerndatDir holds CRIU's kernel-probe cache, on a 1 MiB tmpfs that a
// reboot clears (/run/criu.kdat links to it).
const KerndatDir = "/run/molt/criu-kdat"

// DefaultCriuPath is where scripts/criu.sh installs criu.
const DefaultCriuPath = "/opt/molt/criu/bin/criu"

func findCriu(p string) string {
	if p != "" {
		return p
	}
	if _, err := os.Stat(DefaultCriuPath); err == nil {
		return DefaultCriuPath
	}
	if p, err := exec.LookPath("criu"); err == nil {
		return p
	}
	return ""
}

func (m *Manager) criuFeature() meta.Feature {
	if m.criu == nil {
		return meta.Feature{Name: "full-checkpoint", Reason: "no criu found: run scripts/criu.sh"}
	}
	f := m.criu.Probe(context.Background())
	if p := criuProblem(f); p != "" {
		return meta.Feature{Name: "full-checkpoint", Reason: p}
	}
	d := fmt.Sprintf("CRIU %s at %s; self-test %.0f ms; lazy pages %v; dirty tracking %v", f.Version, m.criu.Path(), f.SelfTestMS, f.LazyPages, f.DirtyTrack)
	return meta.Feature{Name: "full-checkpoint", Supported: true, Detail: d}
}

func poolDetail(p *pool.Pool) string {
	d := "state root is on btrfs"
	if p.Loop {
		d = "loop file " + p.Backing + " on " + p.Device
	}
	d += fmt.Sprintf(", %d KiB nodes", p.NodeSize>>10)
	if p.NodeSize > pool.DefaultNodeSize {
		// See pool.DefaultNodeSize.
		d += fmt.Sprintf(" (snapshots of a long-lived root slow down as they pile up; a pool made with %d KiB nodes does not)", pool.DefaultNodeSize>>10)
	}
	return d
}

func notFound(kind, ref string) error {
	return fmt.Errorf("%s %q: %w", kind, ref, errdefs.ErrNotFound)
}

// DB is the engine's metadata database (the daemon keeps its tenants
// and tokens there).
func (m *Manager) DB() *meta.DB { return m.db }
