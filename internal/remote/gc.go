package remote

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/objstore"
)

// Garbage collection (docs/storage.md, "Garbage collection"). Recipes
// and sandbox documents are the roots: a pack no recipe names, and a
// history object no document names, is garbage. Uploads write packs
// before the recipe that names them, and share chunks of packs already
// in the store, so an object nothing names now may be named in a
// moment. A GC run therefore only condemns such an object, publishing
// it in gc.json with the time; a later run deletes it if it is still
// named by nothing and was condemned at least the grace period before.
// An upload reads gc.json (through gc-gen.json: only when a run changed
// it) when it starts (its index then leaves out condemned and deleted
// packs) and again just before it writes its recipe, and fails if the
// recipe names one: an upload that commits names only packs no run has
// condemned, and the run that would delete them must first condemn
// them, a grace period before, by which time it sees the recipe. So an
// upload must write its recipe within the grace period of that last
// check (a single PUT), and only one GC may run at a time against a
// store (two would each write gc.json): a run takes the store's lease.

const gcKey = "gc.json"

// gcGenKey holds gc.json's generation alone, written after it: uploads
// read it (a few bytes) and gc.json only when it changed.
const gcGenKey = "gc-gen.json"

// maxGCState bounds gc.json.
const maxGCState = 64 << 20

// deletedFor is how long gc.json remembers a deleted pack: a daemon that
// last read it half as long ago drops its whole index (syncGC).
const deletedFor = 7 * 24 * time.Hour

// MinGCGrace bounds the grace period from below.
const MinGCGrace = time.Minute

// gcState is gc.json.
type gcState struct {
	Layout     int   `json:"layout"`
	Generation int64 `json:"generation"`
	// Condemned are the object keys (packs/…, history/…) named by
	// nothing at the run that condemned them, with its time.
	Condemned map[string]time.Time `json:"condemned,omitempty"`
	// Deleted are the packs deleted in the last deletedFor, by name.
	Deleted map[string]time.Time `json:"deleted,omitempty"`
	Updated time.Time            `json:"updated"`
}

// gone is the set of packs an upload must not name: condemned or
// deleted.
func (st gcState) gone() map[string]bool {
	out := map[string]bool{}
	for k := range st.Condemned {
		if name, ok := packOf(k); ok {
			out[name] = true
		}
	}
	for name := range st.Deleted {
		out[name] = true
	}
	return out
}

// packOf is the pack name of key packs/HH/NAME.
func packOf(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, "packs/")
	if !ok || len(rest) != 3+64 || rest[2] != '/' {
		return "", false
	}
	name := rest[3:]
	return name, packName.MatchString(name) && rest[:2] == name[:2]
}

// readGC reads gc.json (the zero state if there is none).
func (s *Store) readGC(ctx context.Context) (gcState, error) {
	var st gcState
	b, err := readAll(ctx, s.b, gcKey, maxGCState)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("store: %s: %w", gcKey, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, bad("%s: %v", gcKey, err)
	}
	if st.Layout != Layout {
		return st, fmt.Errorf("store: %s: layout %d, this molt reads layout %d: %w", gcKey, st.Layout, Layout, errdefs.ErrNotSupported)
	}
	return st, nil
}

// readGCGen reads gc.json's generation (0 before any run).
func (s *Store) readGCGen(ctx context.Context) (int64, error) {
	var g struct {
		Generation int64 `json:"generation"`
	}
	b, err := readAll(ctx, s.b, gcGenKey, 4096)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("store: %s: %w", gcGenKey, err)
	}
	if err := json.Unmarshal(b, &g); err != nil {
		return 0, bad("%s: %v", gcGenKey, err)
	}
	return g.Generation, nil
}

// changedGC reads gc.json if its generation is not the one last seen
// (ok false: unchanged).
func (s *Store) changedGC(ctx context.Context) (st gcState, ok bool, err error) {
	g, err := s.readGCGen(ctx)
	if err != nil {
		return st, false, err
	}
	s.mu.Lock()
	seen := s.gcGen
	s.mu.Unlock()
	if g == seen {
		return st, false, nil
	}
	st, err = s.readGC(ctx)
	return st, err == nil, err
}

// syncGC, at an upload's start, drops from the index the packs gc.json
// condemns or deleted since the last look (all of it if that look is
// too old for gc.json to still name every deletion), and loads it.
func (s *Store) syncGC(ctx context.Context) error {
	st, changed, err := s.changedGC(ctx)
	if err != nil {
		return err
	}
	now, gone := time.Now(), st.gone()
	s.mu.Lock()
	switch {
	case !changed:
		s.gcSynced = now // nothing was missed
		s.mu.Unlock()
		return s.ensureIndex(ctx)
	case s.loaded && now.Sub(s.gcSynced) > deletedFor/2:
		s.packs, s.packIdx, s.chunks, s.loaded = nil, map[string]int32{}, map[[32]byte]loc{}, false
	default:
		s.dropPacks(gone)
	}
	s.gcGen, s.gcSynced, s.gcGone = st.Generation, now, gone
	s.mu.Unlock()
	return s.ensureIndex(ctx)
}

// dropPacks forgets the chunks of the packs gone: uploads no longer
// share them.
//
// +checklocks:s.mu
func (s *Store) dropPacks(gone map[string]bool) {
	drop := map[int32]bool{}
	for name := range gone {
		if i, ok := s.packIdx[name]; ok {
			drop[i] = true
		}
	}
	if len(drop) == 0 {
		return
	}
	for h, l := range s.chunks {
		if drop[l.pack] {
			delete(s.chunks, h)
		}
	}
}

// checkGC fails if a GC condemned or deleted one of packs: the recipe
// naming them must not be written (the upload is retried, and shares
// nothing of those packs).
func (s *Store) checkGC(ctx context.Context, packs []string) error {
	st, changed, err := s.changedGC(ctx)
	if err != nil {
		return err
	}
	var gone map[string]bool
	if changed {
		gone = st.gone()
	} else {
		s.mu.Lock()
		gone = s.gcGone
		s.mu.Unlock()
	}
	var hit []string
	for _, p := range packs {
		if gone[p] {
			hit = append(hit, p)
		}
	}
	if len(hit) > 0 {
		s.mu.Lock()
		s.dropPacks(gone)
		s.gcGone = gone
		if changed {
			s.gcGen = st.Generation
		}
		s.mu.Unlock()
		return fmt.Errorf("store: a garbage collection condemned pack %s while this upload ran; it must be retried: %w", hit[0], errdefs.ErrUnavailable)
	}
	return nil
}

// GCOptions configures a GC run.
type GCOptions struct {
	// Grace is how long an object stays condemned before it goes (at
	// least MinGCGrace).
	Grace time.Duration
	// DryRun reports and changes nothing.
	DryRun bool
	// Now is the clock (time.Now if nil).
	Now func() time.Time
}

// GCReport says what a GC run found and did (the API's report).
type GCReport = v1.StoreGCReport

// GC runs one garbage collection over the store.
func (s *Store) GC(ctx context.Context, o GCOptions) (GCReport, error) {
	rep := GCReport{DryRun: o.DryRun}
	if o.Grace < MinGCGrace {
		return rep, fmt.Errorf("store gc: a grace period of %v, at least %v: %w", o.Grace, MinGCGrace, errdefs.ErrInvalidArgument)
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	var lease *gcLeaseHeld
	if !o.DryRun {
		var err error
		if lease, err = s.leaseGC(ctx); err != nil {
			return rep, err
		}
		defer lease.release(ctx)
	}
	st, err := s.readGC(ctx)
	if err != nil {
		return rep, err
	}
	live, err := s.liveObjects(ctx, &rep)
	if err != nil {
		return rep, err
	}
	cands, err := s.gcCandidates(ctx, &rep)
	if err != nil {
		return rep, err
	}
	t := now().UTC()
	next := gcState{Layout: Layout, Generation: st.Generation + 1, Condemned: map[string]time.Time{}, Deleted: map[string]time.Time{}, Updated: t}
	for name, at := range st.Deleted {
		if t.Sub(at) < deletedFor {
			next.Deleted[name] = at
		}
	}
	var errs []error
	for _, k := range cands {
		at, was := st.Condemned[k]
		switch {
		case live[k]:
			if was {
				rep.Revived++
			}
		case !was:
			next.Condemned[k] = t
			rep.Condemned++
		case t.Sub(at) < o.Grace:
			next.Condemned[k] = at
			rep.Waiting++
		default:
			size := s.gcSize(ctx, k)
			if !o.DryRun {
				if err := lease.hold(ctx); err != nil {
					return rep, errors.Join(append(errs, err)...)
				}
				if err := s.gcDelete(ctx, k); err != nil {
					errs = append(errs, err)
					next.Condemned[k] = at
					continue
				}
			}
			rep.DeletedBytes += size
			if name, ok := packOf(k); ok {
				next.Deleted[name] = t
				rep.DeletedPacks++
			} else {
				rep.DeletedHistory++
			}
		}
	}
	rep.Generation = next.Generation
	if o.DryRun {
		return rep, errors.Join(errs...)
	}
	// gc.json, then its generation (uploads read that first), by the
	// run that holds the lease.
	if err := lease.hold(ctx); err != nil {
		return rep, errors.Join(append(errs, err)...)
	}
	if err := s.putJSON(ctx, gcKey, next); err != nil {
		return rep, errors.Join(append(errs, err)...)
	}
	if err := s.putJSON(ctx, gcGenKey, map[string]int64{"generation": next.Generation}); err != nil {
		errs = append(errs, err)
	}
	return rep, errors.Join(errs...)
}

const gcLeaseKey = "gc-lease.json"

// gcLease bounds a run's lease: a run that died leaves one that ends.
const gcLease = 30 * time.Minute

type gcLeaseDoc struct {
	Owner string    `json:"owner"` // the host's key
	Run   string    `json:"run"`
	Until time.Time `json:"until"`
}

// gcRenewEvery is how often a run renews its lease, at most: before a
// deletion, and before it writes gc.json.
var gcRenewEvery = gcLease / 3

// gcLeaseHeld is a run's lease: its document as written and the version
// the store gave it.
type gcLeaseHeld struct {
	s       *Store
	mine    gcLeaseDoc
	version string
	renewed time.Time
}

// leaseGC takes the store's GC lease, refusing while another run holds
// one: the lease is written only over the version read (or where there
// was none), so of two runs that start at once one gets it. The run
// renews it as it goes (hold), and release ends it the same way.
func (s *Store) leaseGC(ctx context.Context) (*gcLeaseHeld, error) {
	var l gcLeaseDoc
	b, version, err := s.b.ReadVersion(ctx, gcLeaseKey, 4096)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		version = ""
	case err != nil:
		return nil, fmt.Errorf("store gc: %s: %w", gcLeaseKey, err)
	default:
		if err := json.Unmarshal(b, &l); err != nil {
			return nil, fmt.Errorf("store gc: %s cannot be read, so whether a run holds it is unknown: %v: %w", gcLeaseKey, err, errdefs.ErrFailedPrecondition)
		}
		if time.Now().Before(l.Until) {
			return nil, fmt.Errorf("store gc: a run of host %s holds the store's lease until %s (one run at a time per store): %w", l.Owner, l.Until.UTC().Format(time.RFC3339), errdefs.ErrConflict)
		}
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	h := &gcLeaseHeld{s: s, mine: gcLeaseDoc{Owner: s.k.KeyID(), Run: hex.EncodeToString(nonce[:])}, version: version}
	if err := h.write(ctx, time.Now().Add(gcLease)); errors.Is(err, objstore.ErrChanged) {
		return nil, fmt.Errorf("store gc: another run took the store's lease at the same moment: %w", errdefs.ErrConflict)
	} else if err != nil {
		return nil, err
	}
	return h, nil
}

// write writes the run's lease, until until, over the version it holds,
// and notes the version the store gave it.
func (h *gcLeaseHeld) write(ctx context.Context, until time.Time) error {
	l := h.mine
	l.Until = until
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if err := h.s.b.PutIf(ctx, gcLeaseKey, b, h.version); err != nil {
		return fmt.Errorf("store gc: write %s: %w", gcLeaseKey, err)
	}
	got, version, err := h.s.b.ReadVersion(ctx, gcLeaseKey, 4096)
	if err != nil {
		return fmt.Errorf("store gc: %s: %w", gcLeaseKey, err)
	}
	if !bytes.Equal(got, b) {
		return fmt.Errorf("store gc: %s: %w", gcLeaseKey, objstore.ErrChanged)
	}
	h.version, h.renewed = version, time.Now()
	return nil
}

// hold renews the lease if it was last written gcRenewEvery ago or
// more: a run that lost it (another took it after it ran out) stops.
func (h *gcLeaseHeld) hold(ctx context.Context) error {
	if h == nil || time.Since(h.renewed) < gcRenewEvery {
		return nil
	}
	if err := h.write(ctx, time.Now().Add(gcLease)); err != nil {
		if errors.Is(err, objstore.ErrChanged) {
			return fmt.Errorf("store gc: this run lost the store's lease (it ran out, and another run took it); it stops: %w", errdefs.ErrConflict)
		}
		return err
	}
	return nil
}

// release ends the lease: an ended lease over this run's, if it is
// still this run's.
func (h *gcLeaseHeld) release(ctx context.Context) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	_ = h.write(dctx, time.Now().Add(-time.Second))
}

// liveObjects lists what recipes and documents name. A recipe or a
// document that cannot be read ends the run: what it names is unknown.
func (s *Store) liveObjects(ctx context.Context, rep *GCReport) (map[string]bool, error) {
	live := map[string]bool{}
	keys, err := s.b.List(ctx, "checkpoints/")
	if err != nil {
		return nil, fmt.Errorf("store gc: list recipes: %w", err)
	}
	for _, k := range keys {
		var r struct {
			Packs []string `json:"packs"`
		}
		if found, err := s.gcRead(ctx, k, maxRecipe, &r); err != nil || !found {
			if err != nil {
				return nil, err
			}
			continue
		}
		rep.Recipes++
		for _, p := range r.Packs {
			if packName.MatchString(p) {
				live[packKey(p)] = true
			}
		}
	}
	keys, err = s.b.List(ctx, "sandboxes/")
	if err != nil {
		return nil, fmt.Errorf("store gc: list sandboxes: %w", err)
	}
	for _, k := range keys {
		var d struct {
			Sandbox string `json:"sandbox"`
			History *Blob  `json:"history"`
		}
		if found, err := s.gcRead(ctx, k, maxSandbox, &d); err != nil || !found {
			if err != nil {
				return nil, err
			}
			continue
		}
		rep.Sandboxes++
		if d.History != nil {
			live[historyKey(d.Sandbox, d.History.SHA256)] = true
		}
	}
	return live, nil
}

// gcRead reads the JSON object key into v; found is false if it went
// meanwhile.
func (s *Store) gcRead(ctx context.Context, key string, max int64, v any) (found bool, err error) {
	b, err := readAll(ctx, s.b, key, max)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store gc: %s: %w", key, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("store gc: %s cannot be read, so what it names is unknown: %v: %w", key, err, errdefs.ErrFailedPrecondition)
	}
	return true, nil
}

// gcCandidates lists the packs (by the key of the pack, whether its data
// or only its index is there) and the history objects.
func (s *Store) gcCandidates(ctx context.Context, rep *GCReport) ([]string, error) {
	keys, err := s.b.List(ctx, "packs/")
	if err != nil {
		return nil, fmt.Errorf("store gc: list packs: %w", err)
	}
	seen := map[string]bool{}
	var out []string
	for _, k := range keys {
		name, ok := packOf(strings.TrimSuffix(k, ".idx"))
		if ok && !seen[name] {
			seen[name] = true
			out = append(out, packKey(name))
			rep.Packs++
		}
	}
	hist, err := s.b.List(ctx, "history/")
	if err != nil {
		return nil, fmt.Errorf("store gc: list histories: %w", err)
	}
	return append(out, hist...), nil
}

// gcSize is the bytes object key holds (a pack's with its index).
func (s *Store) gcSize(ctx context.Context, key string) int64 {
	n, _ := s.b.Stat(ctx, key)
	if _, ok := packOf(key); ok {
		m, _ := s.b.Stat(ctx, key+".idx")
		n += m
	}
	return n
}

// gcDelete deletes a condemned object: a pack's index first (a daemon
// loading indexes then no longer shares its chunks), then its data.
func (s *Store) gcDelete(ctx context.Context, key string) error {
	if _, ok := packOf(key); ok {
		if err := s.b.Delete(ctx, key+".idx"); err != nil {
			return fmt.Errorf("store gc: %s.idx: %w", key, err)
		}
	}
	if err := s.b.Delete(ctx, key); err != nil {
		return fmt.Errorf("store gc: %s: %w", key, err)
	}
	return nil
}
