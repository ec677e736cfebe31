package core

// Lazy resume from the store: the restored tree runs before its memory
// is here. Everything but the private memory pages comes first, as an
// eager fetch brings it (small images, page hash lists, the file tree,
// the pages a restore reads itself); CRIU then restores with its
// lazy-pages daemon, which asks a page server (criu.ServePages) for the
// rest: a page a task faults on first, the others in the background.
// The page server reads them from the store in blocks, checks every
// page against its hash (the hash list was checked against the signed
// recipe), writes them into the checkpoint's local copy and serves
// them from there; a prefetcher fills the blocks nobody asked for, so
// that the local copy is whole soon whatever the tree does. Once it
// is, the checkpoint is local again, as after an eager fetch.
//
// A page that fails its check, or a store that fails, kills the tree
// before the lazy-pages daemon lets go of its memory: a task never
// runs on a page that is not the one dumped.

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/progress"
	"github.com/molt-sh/molt/internal/remote"
	"github.com/molt-sh/molt/internal/revert"
	"github.com/molt-sh/molt/internal/sandbox"
)

// Lazy fetching reads pages in blocks of lazyBlock bytes (aligned in
// the page image); in the background, lazyPrefetch reads of up to
// lazyRun blocks are in flight.
// lazyMinBytes: page images smaller than this in all are fetched
// eagerly. Measured (BENCHMARKS.md): with 8 MiB of memory eager resumed
// in 2.6 s and lazy in 3.6 s, with 100 MiB eager in 2.6 s and lazy in
// 2.4 s.
var lazyMinBytes int64 = 64 << 20

// lazyReadTimeout bounds one read from the store.
const lazyReadTimeout = 2 * time.Minute

// The prefetchers read lazyRun blocks at once.
const (
	lazyBlock    = 1 << 20
	lazyRun      = 8
	lazyPrefetch = 4
)

// errLazyGone: the checkpoint being fetched was deleted meanwhile.
var errLazyGone = errors.New("the checkpoint was deleted")

// lazyFetch is one checkpoint coming from the store while its restored
// tree runs.
type lazyFetch struct {
	m      *Manager
	ck     checkpointRec
	r      remote.Recipe
	pm     *criu.PageMap
	images map[string]*lazyImage // by page image name (pages-N.img)
	ctx    context.Context
	cancel context.CancelFunc
	start  time.Time

	// ours is the page server's end of the socket the lazy-pages
	// daemon asks on, theirs the daemon's (given to the restore).
	ours     *os.File
	theirs   *os.File
	served   chan struct{} // closed when the page server is done
	finished chan struct{} // closed when the fetch ended (done)

	// local: the pages are the local copy's (lazylocal.go).
	local bool

	fetched atomic.Int64 // page bytes read from the store
	asked   atomic.Int64 // page bytes the daemon asked for

	mu sync.Mutex
	// tree is the restored tree's init, once running (the restore
	// returned).
	// +checklocks:mu
	tree sandbox.Init
	// +checklocks:mu
	running bool
	// ended: abandoned or finished; dropped: abandoned.
	// +checklocks:mu
	ended bool
	// +checklocks:mu
	dropped bool
	// err is the first failure.
	// +checklocks:mu
	err error
	// closed: ours is closed.
	// +checklocks:mu
	closed bool
	// guard kills the tree if the daemon dies before every page is in
	// (lazyguard.go); set by the restore, before the tree exists, and
	// released with ours.
	// +checklocks:mu
	guard *lazyGuard
}

// lazyImage is one page image filled lazily.
type lazyImage struct {
	name   string
	obj    remote.Object
	f      *os.File
	hashes []byte // a SHA-256 per page, checked

	mu sync.Mutex
	// have says, per block, whether it is here; wait holds the blocks
	// being fetched; missed counts those not yet here.
	// +checklocks:mu
	have []bool
	// +checklocks:mu
	wait map[int]chan struct{}
	// +checklocks:mu
	missed int
}

type lazyKey struct{}

// withLazy marks ctx as the context of the lazy restore of lf.
func withLazy(ctx context.Context, lf *lazyFetch) context.Context {
	return context.WithValue(ctx, lazyKey{}, lf)
}

// lazyFrom returns the lazy fetch of checkpoint id the restore of ctx
// restores from, or nil.
func lazyFrom(ctx context.Context, id string) *lazyFetch {
	lf, _ := ctx.Value(lazyKey{}).(*lazyFetch)
	if lf == nil || lf.ck.ID != id {
		return nil
	}
	return lf
}

// lazyResumable says whether checkpoint ck, offloaded, may be resumed
// lazily, or why not.
func (m *Manager) lazyResumable(ck checkpointRec) string {
	switch {
	case m.opts.noLazyResume:
		return "lazy resume switched off"
	case ck.Kind != v1.KindFull:
		return "no processes"
	case ck.DataKey != "":
		return "sealed pages are fetched whole"
	case m.criu == nil || !m.criu.Probe(context.Background()).LazyPages:
		return "CRIU cannot restore lazily here"
	}
	return ""
}

// startFetch brings offloaded checkpoint ck for a resume: lazily if it
// can (the fetch returned then holds m.fetchMu until its pages are all
// here, or abandon), else eagerly (ck is then local, and nil returned).
// Either way ck is then restored from as if it were local.
//
// m.fetchMu passes from startFetch to abandon or fill, a hand-off the
// analyzer cannot follow.
//
// +checklocksignore
func (m *Manager) startFetch(ctx context.Context, ck *checkpointRec) (*lazyFetch, error) {
	m.fetchMu.Lock()
	var cur checkpointRec
	if err := m.db.Get(meta.Checkpoints, ck.ID, &cur); err == nil && !cur.Offloaded {
		// Fetched meanwhile (a verification, a standby).
		m.fetchMu.Unlock()
		*ck = cur
		return nil, nil
	}
	lf, err := m.fetchLazy(ctx, *ck)
	if err != nil || lf == nil {
		m.fetchMu.Unlock()
	}
	if err != nil {
		return nil, err
	}
	if lf == nil {
		if err := m.ensureLocal(ctx, ck); err != nil {
			return nil, err
		}
		return nil, nil
	}
	if err := m.register(lf); err != nil {
		lf.abandon()
		return nil, err
	}
	ck.Offloaded = false
	lf.ck.Offloaded = false
	return lf, nil
}

// register lists lf among the fetches under way. Until every page is
// in, a marker says so: a daemon that dies meanwhile takes CRIU's
// lazy-pages daemon with it (its socket closes), which lets the tree's
// tasks fault in zero pages; the next start kills such a tree
// (endLazyFetch).
func (m *Manager) register(lf *lazyFetch) error {
	if err := os.WriteFile(m.lazyMarker(lf.ck.Sandbox), []byte(lf.ck.ID), 0o600); err != nil {
		return err
	}
	m.lazyMu.Lock()
	defer m.lazyMu.Unlock()
	if m.lazies == nil {
		m.lazies = map[*lazyFetch]bool{}
	}
	m.lazies[lf] = true
	return nil
}

// lazyMarker is the file that says sandbox id's memory is being fetched.
func (m *Manager) lazyMarker(id string) string { return filepath.Join(m.sbDir(id), "lazy-fetch") }

// done ends lazy fetch lf's bookkeeping: its marker and its place in
// m.lazies, then closes lf.finished.
func (lf *lazyFetch) done() {
	m := lf.m
	lf.closeOurs()
	_ = os.Remove(m.lazyMarker(lf.ck.Sandbox))
	m.lazyMu.Lock()
	delete(m.lazies, lf)
	m.lazyMu.Unlock()
	close(lf.finished)
}

// closeLazy lets the lazy fetches under way finish (lazyCloseWait at
// most) before the daemon goes: the trees they serve need every page.
// One that does not finish in time has its tree killed.
func (m *Manager) closeLazy() {
	m.lazyMu.Lock()
	var lfs []*lazyFetch
	for lf := range m.lazies {
		lfs = append(lfs, lf)
	}
	m.lazyMu.Unlock()
	deadline := time.After(lazyCloseWait)
	for _, lf := range lfs {
		select {
		case <-lf.finished:
			continue
		case <-deadline:
		}
		lf.fail(errors.New("the daemon is stopping"))
		<-lf.finished
	}
}

// lazyCloseWait is how long Close waits for lazy fetches under way.
var lazyCloseWait = time.Minute

// endLazyFetch, at start, kills the tree of sandbox s if a lazy fetch of
// its memory was under way when the previous daemon stopped: pages it
// never got read as zeros since.
func (m *Manager) endLazyFetch(ctx context.Context, s sandboxRec) {
	b, err := os.ReadFile(m.lazyMarker(s.ID))
	if err != nil {
		return
	}
	m.log.Error("the daemon stopped while this sandbox's memory was being fetched from the store: its processes are killed (start or resume it again)", "sandbox", s.ID, "checkpoint", strings.TrimSpace(string(b)))
	if cg, err := cgroup.Load(m.cgroupName(s.ID)); err == nil {
		if err := cg.Kill(ctx); err != nil {
			m.log.Warn("cannot kill the processes of a sandbox", "sandbox", s.ID, "err", err)
		}
	}
	_ = s.Init.Signal(unix.SIGKILL)
	_ = os.Remove(m.lazyMarker(s.ID))
}

// fetchLazy makes the local copy of offloaded checkpoint ck whole but
// for its lazy pages, and returns the fetch that brings them once the
// tree is restored (nil: fetch ck eagerly; the reason is logged). The
// caller holds m.fetchMu; it passes to the fetch, which releases it
// when it is done, or to abandon.
func (m *Manager) fetchLazy(ctx context.Context, ck checkpointRec) (*lazyFetch, error) {
	if why := m.lazyResumable(ck); why != "" {
		m.log.Debug("store: resuming eagerly", "checkpoint", ck.ID, "why", why)
		return nil, nil
	}
	progress.Report(ctx, progress.Step{Message: "fetching checkpoint " + ck.ID + " from the store, its memory on demand"})
	r, err := m.store.Recipe(ctx, ck.ID)
	if err != nil {
		return nil, err
	}
	if !sameObjects(r, ck.Objects) {
		m.log.Info("store: lazy resume: the recipe lists other objects than the record; fetching eagerly", "checkpoint", ck.ID)
		return nil, nil
	}
	if err := m.room("fetch "+ck.ID, r.Size()); err != nil {
		return nil, err
	}
	lf := &lazyFetch{m: m, ck: ck, r: r, images: map[string]*lazyImage{}, start: time.Now()}
	rv := revert.Logged(m.log, "lazy fetch")
	defer rv.Fail()
	_ = m.cks.Delete(ck.ID) // what a failed fetch left
	if _, err := m.cks.Create(ck.ID); err != nil {
		return nil, err
	}
	rv.Add(func() error { return m.cks.Delete(ck.ID) })
	dir := m.ckDir(ck.ID)
	hashOf := map[string]bool{}
	for _, o := range r.Objects {
		if name, ok := strings.CutPrefix(o.Name, ckstore.PageHashDir+"/"); ok {
			hashOf[name] = true
		}
	}
	var lazy []remote.Object
	var lazyBytes int64
	isLazy := map[string]bool{}
	for _, o := range r.Objects {
		name, ok := strings.CutPrefix(o.Name, ckstore.ImagesDir+"/")
		if ok && strings.HasPrefix(name, "pages-") && hashOf[name] && o.Size >= lazyBlock && o.Size%criu.PageSize == 0 {
			lazy = append(lazy, o)
			lazyBytes += o.Size
			isLazy[o.Name] = true
		}
	}
	if lazyBytes < lazyMinBytes {
		m.log.Debug("store: resuming eagerly", "checkpoint", ck.ID, "why", "little memory", "bytes", lazyBytes)
		return nil, nil
	}
	for _, o := range r.Objects {
		if isLazy[o.Name] {
			continue
		}
		if err := m.store.FetchObject(ctx, r, o, dir); err != nil {
			return nil, err
		}
	}
	rv.Add(lf.closeFiles)
	for _, o := range lazy {
		li, err := openLazyImage(dir, o)
		if err != nil {
			return nil, err
		}
		lf.images[li.name] = li
	}
	if err := m.fetchTree(ctx, ck, r); err != nil {
		return nil, err
	}
	// The manifests as fetchCheckpoint writes them; the signed one is
	// checked against the record here, as a restore's verification
	// would (which cannot hash pages that are not here yet).
	if err := m.cks.Backend().PutManifest(ck.ID, r.Manifest); err != nil {
		return nil, err
	}
	if err := m.cks.Reader(ck.ID).CheckManifest(ck.Objects); err != nil {
		return nil, fmt.Errorf("checkpoint %s fetched from the store: %w", ck.ID, err)
	}
	if err := m.cks.Backend().PutManifest(ck.ID, m.committedManifest(ck)); err != nil {
		return nil, err
	}
	if lf.pm, err = criu.ReadPageMap(m.cks.Images(ck.ID)); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", ck.ID, err)
	}
	for name, n := range lf.pm.Pages() {
		if li := lf.images[name]; li != nil && n*criu.PageSize != uint64(li.obj.Size) {
			return nil, fmt.Errorf("checkpoint %s: %s holds %d bytes, its pagemap counts %d pages: %w", ck.ID, name, li.obj.Size, n, errdefs.ErrFailedPrecondition)
		}
	}
	lf.ctx, lf.cancel = context.WithCancel(context.WithoutCancel(ctx))
	rv.Add(func() error { lf.cancel(); return nil })
	// The pages the restore reads itself.
	for _, run := range lf.pm.Eager() {
		if li := lf.images[run.Image]; li != nil {
			if err := lf.ensure(li, int64(run.Index), int64(run.Pages)); err != nil {
				return nil, err
			}
		}
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	lf.ours, lf.theirs = os.NewFile(uintptr(fds[0]), "page server"), os.NewFile(uintptr(fds[1]), "lazy pages")
	lf.served, lf.finished = make(chan struct{}), make(chan struct{})
	rv.Success()
	go lf.serve()
	return lf, nil
}

func openLazyImage(dir string, o remote.Object) (*lazyImage, error) {
	name := strings.TrimPrefix(o.Name, ckstore.ImagesDir+"/")
	hashes, err := os.ReadFile(filepath.Join(dir, ckstore.PageHashDir, name))
	if err != nil {
		return nil, err
	}
	if int64(len(hashes)) != o.Size/criu.PageSize*sha256.Size {
		return nil, fmt.Errorf("%s: %d bytes of page hashes for %d pages: %w", name, len(hashes), o.Size/criu.PageSize, errdefs.ErrFailedPrecondition)
	}
	fd, err := unix.Open(filepath.Join(dir, o.Name), unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), o.Name)
	if err := f.Truncate(o.Size); err != nil {
		f.Close()
		return nil, err
	}
	blocks := int((o.Size + lazyBlock - 1) / lazyBlock)
	return &lazyImage{name: name, obj: o, f: f, hashes: hashes, have: make([]bool, blocks), wait: map[int]chan struct{}{}, missed: blocks}, nil
}

func (lf *lazyFetch) closeFiles() error {
	for _, li := range lf.images {
		li.f.Close()
	}
	return nil
}

// ensure makes pages [index, index+n) of li local and checked.
func (lf *lazyFetch) ensure(li *lazyImage, index, n int64) error {
	if index < 0 || n < 0 || (index+n)*criu.PageSize > li.obj.Size {
		return fmt.Errorf("%s: pages %d+%d beyond its %d bytes", li.name, index, n, li.obj.Size)
	}
	for b := int(index * criu.PageSize / lazyBlock); int64(b)*lazyBlock < (index+n)*criu.PageSize; b++ {
		if err := lf.block(li, b); err != nil {
			return err
		}
	}
	return nil
}

// block makes block b of li local, fetching it unless it is here or
// being fetched (then it waits for that fetch).
func (lf *lazyFetch) block(li *lazyImage, b int) error {
	li.mu.Lock()
	if li.have[b] {
		li.mu.Unlock()
		return nil
	}
	if ch := li.wait[b]; ch != nil {
		li.mu.Unlock()
		select {
		case <-ch:
		case <-lf.ctx.Done():
			return lf.ctx.Err()
		}
		li.mu.Lock()
		ok := li.have[b]
		li.mu.Unlock()
		if !ok {
			err := lf.failed()
			if err == nil {
				err = errors.New("its fetch failed")
			}
			return fmt.Errorf("%s: block %d: %w", li.name, b, err)
		}
		return nil
	}
	ch := make(chan struct{})
	li.wait[b] = ch
	li.mu.Unlock()
	return lf.fetchBlocks(li, b, []chan struct{}{ch})
}

// prefetch makes blocks b.. of li local, up to n of them, in one read
// from the store: those neither here nor being fetched, from b on until
// the first that is.
func (lf *lazyFetch) prefetch(li *lazyImage, b, n int) {
	li.mu.Lock()
	var chs []chan struct{}
	for k := b; k < b+n && k < len(li.have) && !li.have[k] && li.wait[k] == nil; k++ {
		ch := make(chan struct{})
		li.wait[k] = ch
		chs = append(chs, ch)
	}
	li.mu.Unlock()
	if len(chs) > 0 {
		_ = lf.fetchBlocks(li, b, chs)
	}
}

// fetchBlocks fetches the len(chs) blocks of li from b, which the caller
// claimed (chs are their wait channels), and ends the claims.
func (lf *lazyFetch) fetchBlocks(li *lazyImage, b int, chs []chan struct{}) error {
	err := lf.fetchRange(li, b, len(chs))
	li.mu.Lock()
	for k, ch := range chs {
		delete(li.wait, b+k)
		if err == nil {
			li.have[b+k] = true
			li.missed--
		}
		close(ch)
	}
	li.mu.Unlock()
	if err != nil {
		lf.fail(err)
	}
	return err
}

// fetchRange reads blocks [b, b+n) of li from the store, checks each
// page against its hash and writes them to the local copy.
func (lf *lazyFetch) fetchRange(li *lazyImage, b, n int) error {
	off := int64(b) * lazyBlock
	buf := make([]byte, min(int64(n)*lazyBlock, li.obj.Size-off))
	// A read under way is not cut short when the fetch fails: it is
	// bounded, and a request dropped midway leaves the store's server
	// a connection to wind down.
	if err := lf.ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(lf.ctx), lazyReadTimeout)
	defer cancel()
	if err := lf.m.store.ReadAt(ctx, lf.r, li.obj, buf, off); err != nil {
		return err
	}
	for p := 0; p < len(buf); p += criu.PageSize {
		page := (off + int64(p)) / criu.PageSize
		sum := sha256.Sum256(buf[p : p+criu.PageSize])
		if string(sum[:]) != string(li.hashes[page*sha256.Size:(page+1)*sha256.Size]) {
			return fmt.Errorf("checkpoint %s: %s: page %d from the store is not the page dumped: %w", lf.ck.ID, li.name, page, errdefs.ErrFailedPrecondition)
		}
	}
	if _, err := li.f.WriteAt(buf, off); err != nil {
		return err
	}
	lf.fetched.Add(int64(len(buf)))
	return nil
}

// read is the page server's source: pages come from the local copy once
// they are there.
func (lf *lazyFetch) read(image string, index uint64, n int, buf []byte) error {
	if h := lf.m.hooks.lazyRead; h != nil {
		h()
	}
	li := lf.images[image]
	if li == nil {
		// A page image fetched whole.
		f, err := os.Open(filepath.Join(lf.m.cks.Images(lf.ck.ID), image))
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.ReadAt(buf, int64(index)*criu.PageSize)
		return err
	}
	lf.asked.Add(int64(len(buf)))
	if err := lf.ensure(li, int64(index), int64(n)); err != nil {
		return err
	}
	_, err := li.f.ReadAt(buf, int64(index)*criu.PageSize)
	return err
}

// serve answers the lazy-pages daemon until it has every page.
func (lf *lazyFetch) serve() {
	defer close(lf.served)
	err := criu.ServePages(lf.ours, lf.pm, lf.read)
	if err != nil {
		lf.fail(err)
		return
	}
	lf.closeOurs()
}

// fail records the fetch's first failure and kills the restored tree,
// if there is one, before the lazy-pages daemon is let go: its tasks
// must not run on memory that never came.
func (lf *lazyFetch) fail(err error) {
	lf.mu.Lock()
	if lf.dropped {
		lf.mu.Unlock()
		return
	}
	if lf.err == nil {
		lf.err = err
		lf.m.log.Error("store: lazy resume failed: the restored tree is killed", "sandbox", lf.ck.Sandbox, "checkpoint", lf.ck.ID, "err", err)
	}
	init, running := lf.tree, lf.running
	lf.mu.Unlock()
	lf.cancel()
	if running {
		_ = init.Signal(unix.SIGKILL)
		waitGone(init, 5*time.Second)
		lf.closeOurs()
	}
	// Without a tree yet, the restore ends it (started).
}

// failed is the fetch's first failure, nil if none.
func (lf *lazyFetch) failed() error {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	return lf.err
}

// closeOurs lets CRIU's lazy-pages daemon go: the daemon's end of its
// socket is closed, and the guard, which holds a copy, released.
func (lf *lazyFetch) closeOurs() {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if !lf.closed {
		lf.closed = true
		lf.ours.Close()
	}
	lf.guard.release()
}

// guardWith starts the guard of the restore into cgroup cg.
func (lf *lazyFetch) guardWith(cg string) error {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if lf.closed || lf.guard != nil {
		return fmt.Errorf("lazy resume of %s: a guard runs already, or the page server is closed", lf.ck.ID)
	}
	var err error
	lf.guard, err = lf.m.startLazyGuard(cg, lf.ours)
	return err
}

// started is told the restored tree, and starts filling the rest. If
// the fetch failed meanwhile, the tree is killed and the error returned.
func (lf *lazyFetch) started(init sandbox.Init) error {
	lf.mu.Lock()
	lf.tree, lf.running = init, true
	err := lf.err
	lf.mu.Unlock()
	if err != nil {
		_ = init.Signal(unix.SIGKILL)
		waitGone(init, 5*time.Second)
		lf.closeOurs()
	}
	// fill ends the fetch either way (a failed one at once).
	if lf.local {
		go lf.fillLocal()
	} else {
		go lf.fill()
	}
	return err
}

// abandon ends a fetch whose restore did not happen: its partial copy
// goes, and m.fetchMu is released.
//
// m.fetchMu passes from startFetch to abandon or fill, a hand-off the
// analyzer cannot follow.
//
// +checklocksignore
func (lf *lazyFetch) abandon() {
	lf.mu.Lock()
	if lf.running || lf.ended {
		lf.mu.Unlock()
		return
	}
	lf.ended, lf.dropped = true, true
	lf.mu.Unlock()
	lf.cancel()
	lf.closeOurs()
	lf.theirs.Close()
	<-lf.served
	lf.closeFiles()
	if lf.local {
		lf.m.metrics.localLazy.WithLabelValues("failed").Inc()
		lf.done()
		return
	}
	_ = lf.m.cks.Delete(lf.ck.ID)
	lf.m.metrics.lazy.WithLabelValues("failed").Inc()
	lf.m.fetchMu.Unlock()
	lf.done()
}

// fill fetches the blocks nobody asked for, then makes the checkpoint
// local (or deletes the partial copy if anything failed), and releases
// m.fetchMu.
//
// m.fetchMu passes from startFetch to abandon or fill, a hand-off the
// analyzer cannot follow.
//
// +checklocksignore
func (lf *lazyFetch) fill() {
	m := lf.m
	type run struct {
		li *lazyImage
		b  int
	}
	var wg sync.WaitGroup
	work := make(chan run)
	for range lazyPrefetch {
		wg.Go(func() {
			for w := range work {
				lf.prefetch(w.li, w.b, lazyRun)
			}
		})
	}
	for _, li := range lf.images {
		for b := 0; b < len(li.have); b += lazyRun {
			select {
			case work <- run{li, b}:
			case <-lf.ctx.Done():
			}
		}
	}
	close(work)
	wg.Wait()
	// What a fault was fetching when its run came, or what failed.
	for _, li := range lf.images {
		for b := range li.have {
			if lf.ctx.Err() != nil {
				break
			}
			_ = lf.block(li, b)
		}
	}
	err := lf.finish()
	lf.mu.Lock()
	lf.ended = true
	if err != nil && lf.err == nil {
		lf.err = err
	}
	lf.mu.Unlock()
	switch {
	case errors.Is(err, errLazyGone):
		m.log.Info("store: lazy resume: the checkpoint was deleted before all its pages came (its sandbox moved or went)", "checkpoint", lf.ck.ID)
		_ = m.cks.Delete(lf.ck.ID)
	case err != nil:
		m.log.Error("store: lazy resume: the checkpoint's local copy is not whole; it stays in the store", "checkpoint", lf.ck.ID, "err", err)
		_ = m.cks.Delete(lf.ck.ID)
		m.metrics.lazy.WithLabelValues("failed").Inc()
	default:
		m.log.Info("store: lazy resume: every page is local", "checkpoint", lf.ck.ID, "sandbox", lf.ck.Sandbox,
			"fetched_bytes", lf.fetched.Load(), "asked_bytes", lf.asked.Load(), "took", time.Since(lf.start).Round(time.Millisecond))
		m.metrics.fetches.Inc()
		m.metrics.lazy.WithLabelValues("ok").Inc()
	}
	m.fetchMu.Unlock()
	if err == nil {
		m.evict()
	}
	// The daemon may still be asking for pages it has not moved yet:
	// the files stay open for it (if evicted meanwhile, unlinked).
	<-lf.served
	lf.closeFiles()
	lf.done()
}

// finish makes the checkpoint local once every block is: its files
// synced, its objects remembered as checked (every page was, against a
// hash list checked against the record), its record no longer
// offloaded.
func (lf *lazyFetch) finish() error {
	if err := lf.failed(); err != nil {
		return err
	}
	var cur checkpointRec
	if err := lf.m.db.Get(meta.Checkpoints, lf.ck.ID, &cur); err != nil {
		return errLazyGone
	}
	if _, err := os.Stat(lf.m.ckDir(lf.ck.ID)); err != nil {
		// Freed meanwhile (a migration's source frees its copies).
		return errLazyGone
	}
	for _, li := range lf.images {
		li.mu.Lock()
		missed := li.missed
		li.mu.Unlock()
		if missed != 0 {
			return fmt.Errorf("%s: %d blocks missing", li.name, missed)
		}
		if err := li.f.Sync(); err != nil {
			return err
		}
	}
	if err := fsnap.SyncFS(lf.m.ckDir(lf.ck.ID)); errors.Is(err, os.ErrNotExist) {
		return errLazyGone
	} else if err != nil {
		return err
	}
	lf.m.cks.Remember(lf.ck.ID, lf.ck.Objects)
	return lf.m.setCheckpoint(lf.ck.ID, func(c *checkpointRec) { c.Offloaded = false })
}
