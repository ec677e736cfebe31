package remote

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/objstore"
)

// packsOf lists the names of the packs in the bucket.
func packsOf(t *testing.T, b objstore.Bucket) map[string]bool {
	t.Helper()
	keys, err := b.List(context.Background(), "packs/")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, k := range keys {
		if name, ok := packOf(strings.TrimSuffix(k, ".idx")); ok {
			out[name] = true
		}
	}
	return out
}

// fetchesWhole fetches checkpoint id from a store opened afresh and
// checks its pages.
func fetchesWhole(t *testing.T, b objstore.Bucket, k *ckstore.Keyring, id string, pages []byte) Recipe {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, b, k)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Recipe(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := s.FetchObjects(ctx, r, dir); err != nil {
		t.Fatalf("fetch %s: %v", id, err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "images/pages-1.img")); err != nil || !bytes.Equal(got, pages) {
		t.Fatalf("%s: fetched pages differ (%v)", id, err)
	}
	if err := s.FetchTree(ctx, r, t.TempDir()); err != nil {
		t.Fatalf("fetch the tree of %s: %v", id, err)
	}
	return r
}

// dirStore opens a store on a directory bucket of its own.
func dirStore(t *testing.T) (objstore.Bucket, *ckstore.Keyring, *Store) {
	t.Helper()
	b, err := objstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	k := keyring(t)
	s, err := Open(context.Background(), b, k)
	if err != nil {
		t.Fatal(err)
	}
	return b, k, s
}

// TestGC: a pack only a deleted recipe named is condemned by one run,
// kept through the grace period, deleted by a run after it; what live
// recipes name stays and fetches whole; an uploader whose index knew
// the deleted pack stores its chunks afresh.
func TestGC(t *testing.T) {
	ctx := context.Background()
	b, k, s := dirStore(t)
	if _, err := s.GC(ctx, GCOptions{Grace: time.Second}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a grace of a second: %v, want invalid_argument", err)
	}
	p1, p2 := randomPages(t, 256), randomPages(t, 256)
	if _, _, err := s.Upload(ctx, artifact(t, "ck0000000002", p2, "two")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Upload(ctx, artifact(t, "ck0000000001", p1, "one")); err != nil {
		t.Fatal(err)
	}
	before := packsOf(t, b)
	r2, err := s.Recipe(ctx, "ck0000000002")
	if err != nil {
		t.Fatal(err)
	}
	named2 := map[string]bool{}
	for _, p := range r2.Packs {
		named2[p] = true
	}
	var only1 []string // packs of ck1 alone
	for p := range before {
		if !named2[p] {
			only1 = append(only1, p)
		}
	}
	if len(only1) == 0 {
		t.Fatal("ck1's pages share every pack with ck2")
	}
	// An old history object, named by no document.
	if _, err := s.PutHistory(ctx, "sb0000000001", []byte(`{"turns":[]}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "ck0000000001"); err != nil {
		t.Fatal(err)
	}

	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	run := func(at time.Duration, dry bool) GCReport {
		t.Helper()
		rep, err := s.GC(ctx, GCOptions{Grace: time.Hour, DryRun: dry, Now: func() time.Time { return t0.Add(at) }})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	if rep := run(0, false); rep.Condemned != len(only1)+1 || rep.DeletedPacks != 0 || rep.Recipes != 1 {
		t.Fatalf("first run: %+v, want %d packs and a history condemned, nothing deleted", rep, len(only1))
	}
	if rep := run(30*time.Minute, false); rep.Waiting != len(only1)+1 || rep.DeletedPacks != 0 {
		t.Fatalf("within the grace period: %+v", rep)
	}
	if rep := run(2*time.Hour, true); rep.DeletedPacks != len(only1) || len(packsOf(t, b)) != len(before) {
		t.Fatalf("dry run: %+v, or it deleted something", rep)
	}
	rep := run(2*time.Hour, false)
	if rep.DeletedPacks != len(only1) || rep.DeletedHistory != 1 || rep.DeletedBytes < int64(len(p1)) {
		t.Fatalf("after the grace period: %+v, want %d packs and the history deleted, at least %d bytes", rep, len(only1), len(p1))
	}
	left := packsOf(t, b)
	for _, p := range only1 {
		if left[p] {
			t.Errorf("pack %s of the deleted checkpoint is still there", p)
		}
	}
	for _, p := range r2.Packs {
		if !left[p] {
			t.Errorf("pack %s of a live checkpoint was deleted", p)
		}
	}
	fetchesWhole(t, b, k, "ck0000000002", p2)

	// s's index had ck1's pages: an upload of them stores them afresh
	// instead of naming a deleted pack.
	_, st, err := s.Upload(ctx, artifact(t, "ck0000000003", p1, "three"))
	if err != nil {
		t.Fatal(err)
	}
	if st.UploadedBytes < int64(len(p1)) {
		t.Fatalf("the upload of deleted pages sent %d bytes: it named deleted packs", st.UploadedBytes)
	}
	fetchesWhole(t, b, k, "ck0000000003", p1)
}

// hookBucket runs hook before the n-th Stat of gc-gen.json.
type hookBucket struct {
	objstore.Bucket
	n    int
	seen int
	hook func()
}

func (h *hookBucket) Stat(ctx context.Context, key string) (int64, error) {
	if key == gcGenKey {
		h.seen++
		if h.seen == h.n {
			h.hook()
		}
	}
	return h.Bucket.Stat(ctx, key)
}

// TestGCRefusesCommit: an upload that shares the chunks of a pack no
// recipe names, while a GC condemns that pack, does not write its
// recipe; retried, it stores the chunks afresh and commits.
func TestGCRefusesCommit(t *testing.T) {
	ctx := context.Background()
	dir, err := objstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	hb := &hookBucket{Bucket: dir}
	k := keyring(t)
	s, err := Open(ctx, hb, k)
	if err != nil {
		t.Fatal(err)
	}
	pages := randomPages(t, 128)
	if _, _, err := s.Upload(ctx, artifact(t, "ck0000000001", pages, "one")); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "ck0000000001"); err != nil {
		t.Fatal(err)
	}
	// The second upload's check before its commit is gc.json's next
	// look (its start is the one before); a GC by another host runs
	// just before it.
	gc, err := Open(ctx, dir, k)
	if err != nil {
		t.Fatal(err)
	}
	hb.n = hb.seen + 2
	hb.hook = func() {
		if rep, err := gc.GC(ctx, GCOptions{Grace: time.Hour}); err != nil || rep.Condemned == 0 {
			t.Errorf("gc: %+v, %v", rep, err)
		}
	}
	_, _, err = s.Upload(ctx, artifact(t, "ck0000000002", pages, "one"))
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("an upload naming a pack condemned meanwhile: %v, want unavailable", err)
	}
	if _, err := s.Recipe(ctx, "ck0000000002"); err == nil {
		t.Fatal("the refused upload wrote its recipe")
	}
	_, st, err := s.Upload(ctx, artifact(t, "ck0000000002", pages, "one"))
	if err != nil {
		t.Fatal(err)
	}
	if st.UploadedBytes < int64(len(pages)) {
		t.Fatalf("the retry sent %d bytes: it shares condemned packs", st.UploadedBytes)
	}
	r := fetchesWhole(t, dir, k, "ck0000000002", pages)
	gone, err := gc.readGC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range r.Packs {
		if gone.gone()[p] {
			t.Fatalf("the committed recipe names condemned pack %s", p)
		}
	}
}

// countBucket counts the reads of gc.json.
type countBucket struct {
	objstore.Bucket
	reads int
}

func (c *countBucket) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if key == gcKey {
		c.reads++
	}
	return c.Bucket.Get(ctx, key, off, n)
}

// TestGCStateReadOnChange: uploads read gc.json only when a run changed
// its generation, not at every upload.
func TestGCStateReadOnChange(t *testing.T) {
	ctx := context.Background()
	dir, k, gc := dirStore(t)
	cb := &countBucket{Bucket: dir}
	s, err := Open(ctx, cb, k)
	if err != nil {
		t.Fatal(err)
	}
	upload := func(id string) {
		t.Helper()
		if _, _, err := s.Upload(ctx, artifact(t, id, randomPages(t, 4), id)); err != nil {
			t.Fatal(err)
		}
	}
	upload("ck0000000001")
	upload("ck0000000002")
	if cb.reads != 0 {
		t.Fatalf("%d reads of gc.json before any run", cb.reads)
	}
	if _, err := gc.GC(ctx, GCOptions{Grace: time.Hour}); err != nil {
		t.Fatal(err)
	}
	upload("ck0000000003")
	upload("ck0000000004")
	if cb.reads != 1 {
		t.Fatalf("%d reads of gc.json after one run, want 1", cb.reads)
	}
}

// TestGCLease: a run refuses while another holds the store's lease, and
// runs once it is released or has ended.
func TestGCLease(t *testing.T) {
	ctx := context.Background()
	_, _, s := dirStore(t)
	held, err := s.leaseGC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GC(ctx, GCOptions{Grace: time.Hour}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a run under another's lease: %v, want conflict", err)
	}
	if _, err := s.GC(ctx, GCOptions{Grace: time.Hour, DryRun: true}); err != nil {
		t.Fatalf("a dry run under another's lease: %v", err)
	}
	held.release(ctx)
	if _, err := s.GC(ctx, GCOptions{Grace: time.Hour}); err != nil {
		t.Fatalf("a run once the lease is released: %v", err)
	}
	// A lease that ended (its run died) does not stop the next.
	if err := s.putJSON(ctx, gcLeaseKey, gcLeaseDoc{Owner: "ed25519:dead", Run: "x", Until: time.Now().Add(-time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GC(ctx, GCOptions{Grace: time.Hour}); err != nil {
		t.Fatalf("a run after an ended lease: %v", err)
	}
	var l gcLeaseDoc
	if found, err := s.gcRead(ctx, gcLeaseKey, 4096, &l); err != nil || !found || time.Now().Before(l.Until) || l.Owner != s.k.KeyID() {
		t.Fatalf("the lease after a run: %+v (found %v, %v), want this host's, ended", l, found, err)
	}
	// Of runs that start at once, one gets the lease.
	const runs = 6
	got := make(chan error, runs)
	for range runs {
		go func() {
			_, err := s.leaseGC(ctx)
			got <- err
		}()
	}
	won := 0
	for range runs {
		switch err := <-got; {
		case err == nil:
			won++
		case !errors.Is(err, errdefs.ErrConflict):
			t.Fatal(err)
		}
	}
	if won != 1 {
		t.Fatalf("%d runs took the lease at once, want 1", won)
	}
}

// deleteHook runs hook with the key before each Delete.
type deleteHook struct {
	objstore.Bucket
	hook func(key string)
}

func (d *deleteHook) Delete(ctx context.Context, key string) error {
	d.hook(key)
	return d.Bucket.Delete(ctx, key)
}

// TestGCLostLease: a run whose lease another run took (it ran out)
// stops before its next deletion and does not write gc.json.
func TestGCLostLease(t *testing.T) {
	defer func(d time.Duration) { gcRenewEvery = d }(gcRenewEvery)
	gcRenewEvery = 0 // renew before every deletion
	ctx := context.Background()
	dir, err := objstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dh := &deleteHook{Bucket: dir, hook: func(string) {}}
	k := keyring(t)
	s, err := Open(ctx, dh, k)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"ck0000000001", "ck0000000002"} {
		if _, _, err := s.Upload(ctx, artifact(t, id, randomPages(t, 64+i), "x")); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := s.GC(ctx, GCOptions{Grace: time.Hour})
	if err != nil || rep.Condemned < 2 {
		t.Fatalf("first run: %+v, %v", rep, err)
	}
	deleted := map[string]bool{} // objects, a pack's data and index as one
	dh.hook = func(key string) {
		deleted[strings.TrimSuffix(key, ".idx")] = true
		if len(deleted) == 1 {
			// Another run takes the lease, as if this one's had run out.
			other := gcLeaseDoc{Owner: "ed25519:other", Run: "other", Until: time.Now().Add(time.Hour)}
			if err := s.putJSON(ctx, gcLeaseKey, other); err != nil {
				t.Error(err)
			}
		}
	}
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	_, err = s.GC(ctx, GCOptions{Grace: time.Hour, Now: later})
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "lost the store's lease") {
		t.Fatalf("a run that lost its lease: %v, want it stopped", err)
	}
	if len(deleted) != 1 {
		t.Fatalf("a run that lost its lease at its first deletion deleted %v, want that one only", deleted)
	}
	st, err := s.readGC(ctx)
	if err != nil || st.Generation != rep.Generation {
		t.Fatalf("gc.json at generation %d (%v) after the stopped run, want %d", st.Generation, err, rep.Generation)
	}
	var l gcLeaseDoc
	if found, err := s.gcRead(ctx, gcLeaseKey, 4096, &l); err != nil || !found || l.Run != "other" {
		t.Fatalf("the lease after the stopped run: %+v (%v), want the other run's", l, err)
	}
}
