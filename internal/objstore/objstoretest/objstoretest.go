// Package objstoretest is the conformance suite of objstore.Bucket: one
// set of tests that every implementation passes (objstore's Dir, and S3
// against a real server), so the layers above may rely on the
// interface's contract and not on one store's habits.
package objstoretest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/objstore"
)

// Run runs the suite; open returns an empty bucket for a subtest (a
// fresh prefix of one bucket will do).
func Run(t *testing.T, open func(t *testing.T) objstore.Bucket) {
	tests := []struct {
		name string
		fn   func(*testing.T, objstore.Bucket)
	}{
		{"RoundTrip", testRoundTrip},
		{"Empty", testEmpty},
		{"Ranges", testRanges},
		{"Missing", testMissing},
		{"List", testList},
		{"ListPages", testListPages},
		{"Delete", testDelete},
		{"Overwrite", testOverwrite},
		{"HostileKeys", testHostileKeys},
		{"ReaderSize", testReaderSize},
		{"ReaderError", testReaderError},
		{"Large", testLarge},
		{"Concurrent", testConcurrent},
		{"Cancelled", testCancelled},
		{"CancelledDuringPut", testCancelledDuringPut},
		{"Conditional", testConditional},
		{"ConditionalRace", testConditionalRace},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t)) })
	}
}

// data returns n reproducible pseudo-random bytes.
func data(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16)})
	_, _ = r.Read(b)
	return b
}

func put(t *testing.T, b objstore.Bucket, key string, d []byte) {
	t.Helper()
	if err := b.Put(t.Context(), key, bytes.NewReader(d), int64(len(d))); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func get(t *testing.T, b objstore.Bucket, key string, off, length int64) []byte {
	t.Helper()
	r, err := b.Get(t.Context(), key, off, length)
	if err != nil {
		t.Fatalf("get %s %d+%d: %v", key, off, length, err)
	}
	defer r.Close()
	d, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("get %s %d+%d: read: %v", key, off, length, err)
	}
	return d
}

// absent checks that key has no object.
func absent(t *testing.T, b objstore.Bucket, key string) {
	t.Helper()
	if n, err := b.Stat(t.Context(), key); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stat %s: size %d, error %v; want fs.ErrNotExist", key, n, err)
	}
}

func testRoundTrip(t *testing.T, b objstore.Bucket) {
	d := data(1, 100_000)
	before := b.Stats()
	put(t, b, "pages/ab/cdef", d)
	if n, err := b.Stat(t.Context(), "pages/ab/cdef"); err != nil || n != int64(len(d)) {
		t.Fatalf("stat: %d, %v; want %d", n, err, len(d))
	}
	if got := get(t, b, "pages/ab/cdef", 0, -1); !bytes.Equal(got, d) {
		t.Fatalf("got %d bytes, not the %d put", len(got), len(d))
	}
	s := b.Stats()
	if s.Requests-before.Requests < 3 || s.Sent-before.Sent < int64(len(d)) || s.Received-before.Received < int64(len(d)) {
		t.Errorf("stats %+v after a put, a stat and a get of %d bytes (from %+v)", s, len(d), before)
	}
	if s := b.String(); s == "" {
		t.Error("String() is empty")
	}
}

func testEmpty(t *testing.T, b objstore.Bucket) {
	put(t, b, "empty", nil)
	if n, err := b.Stat(t.Context(), "empty"); err != nil || n != 0 {
		t.Fatalf("stat: %d, %v", n, err)
	}
	if got := get(t, b, "empty", 0, -1); len(got) != 0 {
		t.Fatalf("got %d bytes", len(got))
	}
	if got := get(t, b, "empty", 0, 0); len(got) != 0 {
		t.Fatalf("got %d bytes", len(got))
	}
	if _, err := b.Get(t.Context(), "empty", 0, 1); err == nil {
		t.Fatal("a byte of an empty object was read")
	}
}

func testRanges(t *testing.T, b objstore.Bucket) {
	d := data(2, 1000)
	put(t, b, "r", d)
	for _, c := range []struct{ off, length int64 }{
		{0, 1}, {999, 1}, {100, 200}, {0, 1000}, {500, -1}, {0, -1}, {999, -1}, {1000, -1}, {1000, 0}, {0, 0}, {10, 0},
	} {
		end := c.off + c.length
		if c.length < 0 {
			end = int64(len(d))
		}
		if got := get(t, b, "r", c.off, c.length); !bytes.Equal(got, d[c.off:end]) {
			t.Errorf("get %d+%d: %d bytes, not bytes %d to %d", c.off, c.length, len(got), c.off, end)
		}
	}
	for _, c := range []struct{ off, length int64 }{
		{999, 2}, {1000, 1}, {0, 1001}, {1001, -1}, {2000, -1}, {5000, 10}, {1001, 0}, {-1, 1}, {-1, -1},
	} {
		if r, err := b.Get(t.Context(), "r", c.off, c.length); err == nil {
			got, _ := io.ReadAll(r)
			r.Close()
			t.Errorf("get %d+%d of 1000 bytes: no error, %d bytes", c.off, c.length, len(got))
		}
	}
}

func testMissing(t *testing.T, b objstore.Bucket) {
	if _, err := b.Get(t.Context(), "nothing/here", 0, -1); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("get of a missing object: %v, want fs.ErrNotExist", err)
	}
	if _, err := b.Get(t.Context(), "nothing/here", 5, 10); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ranged get of a missing object: %v, want fs.ErrNotExist", err)
	}
	absent(t, b, "nothing/here")
	if keys, err := b.List(t.Context(), ""); err != nil || len(keys) != 0 {
		t.Errorf("list of an empty bucket: %q, %v", keys, err)
	}
}

func testList(t *testing.T, b objstore.Bucket) {
	// Put out of order; "a-b" and "a0" sort around "a/1" ('-' < '/' < '0'),
	// unlike a walk of directories.
	keys := []string{"b/x", "a0", "a/2", "ab", "a/1", "a-b", "a/sub/3", "c"}
	for i, k := range keys {
		put(t, b, k, []byte{byte(i)})
	}
	for _, c := range []struct {
		prefix string
		want   []string
	}{
		{"", []string{"a-b", "a/1", "a/2", "a/sub/3", "a0", "ab", "b/x", "c"}},
		{"a/", []string{"a/1", "a/2", "a/sub/3"}},
		{"a", []string{"a-b", "a/1", "a/2", "a/sub/3", "a0", "ab"}},
		{"a/s", []string{"a/sub/3"}},
		{"b/x", []string{"b/x"}},
		{"zz", nil},
	} {
		got, err := b.List(t.Context(), c.prefix)
		if err != nil {
			t.Fatalf("list %q: %v", c.prefix, err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("list %q: %q, want %q", c.prefix, got, c.want)
		}
	}
}

// testListPages lists more keys than S3 returns in one response (1000).
func testListPages(t *testing.T, b objstore.Bucket) {
	const n = 1100
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("many/%04x", i*7919%n)
	}
	parallel(t, 16, n, func(i int) error {
		return b.Put(t.Context(), want[i], strings.NewReader("x"), 1)
	})
	put(t, b, "other", []byte("y"))
	slices.Sort(want)
	got, err := b.List(t.Context(), "many/")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("listed %d keys, want %d in order (first %q, last %q)", len(got), len(want), got[:min(3, len(got))], got[max(0, len(got)-3):])
	}
	if all, err := b.List(t.Context(), ""); err != nil || len(all) != n+1 {
		t.Fatalf("list all: %d keys, %v; want %d", len(all), err, n+1)
	}
}

// parallel runs fn(0..n-1) on workers goroutines, failing t on the
// first error.
func parallel(t *testing.T, workers, n int, fn func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case err := <-errs:
			t.Error(err)
			break feed
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
}

func testDelete(t *testing.T, b objstore.Bucket) {
	put(t, b, "d/1", []byte("one"))
	put(t, b, "d/2", []byte("two"))
	if err := b.Delete(t.Context(), "d/1"); err != nil {
		t.Fatal(err)
	}
	absent(t, b, "d/1")
	if keys, err := b.List(t.Context(), ""); err != nil || !slices.Equal(keys, []string{"d/2"}) {
		t.Fatalf("list after delete: %q, %v", keys, err)
	}
	if err := b.Delete(t.Context(), "d/1"); err != nil {
		t.Fatalf("delete of a deleted object: %v", err)
	}
	if err := b.Delete(t.Context(), "never/was"); err != nil {
		t.Fatalf("delete of a missing object: %v", err)
	}
}

func testOverwrite(t *testing.T, b objstore.Bucket) {
	put(t, b, "o", data(3, 5000))
	d := data(4, 300)
	put(t, b, "o", d)
	if n, err := b.Stat(t.Context(), "o"); err != nil || n != 300 {
		t.Fatalf("stat after overwrite: %d, %v", n, err)
	}
	if got := get(t, b, "o", 0, -1); !bytes.Equal(got, d) {
		t.Fatal("overwrite: got other bytes")
	}
}

// HostileKeys are keys every Bucket refuses.
var HostileKeys = []string{
	"", "../x", "x/../../y", "x/..", "..", ".", "/abs", "a//b", "a/./b", "a/", "a\x00b", "a b", "a\nb",
	"a\\b", "caf\u00e9", strings.Repeat("a", 1000), strings.Repeat("a", objstore.MaxKey+1),
}

func testHostileKeys(t *testing.T, b objstore.Bucket) {
	ctx := t.Context()
	before := b.Stats()
	for _, k := range HostileKeys {
		for op, err := range map[string]error{
			"put":    b.Put(ctx, k, strings.NewReader("x"), 1),
			"get":    getErr(b.Get(ctx, k, 0, -1)),
			"stat":   statErr(b.Stat(ctx, k)),
			"delete": b.Delete(ctx, k),
		} {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%s %q: %v, want ErrInvalidArgument", op, k, err)
			}
		}
	}
	if after := b.Stats(); after.Requests != before.Requests {
		t.Errorf("hostile keys cost %d requests", after.Requests-before.Requests)
	}
	if keys, err := b.List(ctx, ""); err != nil || len(keys) != 0 {
		t.Errorf("list after hostile puts: %q, %v", keys, err)
	}
}

func getErr(r io.ReadCloser, err error) error {
	if r != nil {
		r.Close()
	}
	return err
}

func statErr(_ int64, err error) error { return err }

// testReaderSize puts readers that hold fewer or more bytes than the
// size given: the put fails and leaves no object, or the old one.
func testReaderSize(t *testing.T, b objstore.Bucket) {
	ctx := t.Context()
	for _, c := range []struct{ have, size int }{{10, 11}, {12, 11}, {1, 0}, {0, 1}} {
		k := fmt.Sprintf("size/%d-%d", c.have, c.size)
		if err := b.Put(ctx, k, bytes.NewReader(data(5, c.have)), int64(c.size)); err == nil {
			t.Errorf("put of %d bytes as %d: no error", c.have, c.size)
		}
		absent(t, b, k)
	}
	old := []byte("the old object")
	put(t, b, "size/kept", old)
	if err := b.Put(ctx, "size/kept", bytes.NewReader(data(6, 100)), 99); err == nil {
		t.Error("put of 100 bytes as 99: no error")
	}
	if got := get(t, b, "size/kept", 0, -1); !bytes.Equal(got, old) {
		t.Errorf("a failed put replaced the object: %q", got)
	}
	// Larger than a part of a multipart upload (S3's 16 MiB).
	for _, c := range []struct{ have, size int }{{20 << 20, 18 << 20}, {18 << 20, 20 << 20}} {
		k := fmt.Sprintf("size/large-%d-%d", c.have, c.size)
		if err := b.Put(ctx, k, onlyReader{bytes.NewReader(make([]byte, c.have))}, int64(c.size)); err == nil {
			t.Errorf("put of %d bytes as %d: no error", c.have, c.size)
		}
		absent(t, b, k)
	}
	if keys, err := b.List(ctx, ""); err != nil || !slices.Equal(keys, []string{"size/kept"}) {
		t.Errorf("list: %q, %v", keys, err)
	}
}

// onlyReader hides a reader's other methods (io.Seeker, io.ReaderAt),
// as a stream has none.
type onlyReader struct{ io.Reader }

// failingReader fails after n bytes.
type failingReader struct{ n int }

var errReader = errors.New("the reader broke")

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, errReader
	}
	k := min(len(p), r.n)
	clear(p[:k])
	r.n -= k
	return k, nil
}

func testReaderError(t *testing.T, b objstore.Bucket) {
	for _, n := range []int{0, 1000, 17 << 20} {
		k := fmt.Sprintf("broken/%d", n)
		if err := b.Put(t.Context(), k, &failingReader{n: n}, 20<<20); err == nil {
			t.Errorf("put of a reader that broke after %d bytes: no error", n)
		}
		absent(t, b, k)
	}
}

func testLarge(t *testing.T, b objstore.Bucket) {
	d := data(7, 20<<20)
	if err := b.Put(t.Context(), "large", onlyReader{bytes.NewReader(d)}, int64(len(d))); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Stat(t.Context(), "large"); err != nil || n != int64(len(d)) {
		t.Fatalf("stat: %d, %v", n, err)
	}
	if got := get(t, b, "large", 0, -1); sha256.Sum256(got) != sha256.Sum256(d) {
		t.Fatalf("got %d bytes, not the %d put", len(got), len(d))
	}
	// Across the first part's end.
	off := int64(16<<20 - 100)
	if got := get(t, b, "large", off, 300); !bytes.Equal(got, d[off:off+300]) {
		t.Fatal("a range across the parts differs")
	}
	if got := get(t, b, "large", int64(len(d))-10, -1); !bytes.Equal(got, d[len(d)-10:]) {
		t.Fatal("the last bytes differ")
	}
}

func testConcurrent(t *testing.T, b objstore.Bucket) {
	const n = 32
	parallel(t, 8, n, func(i int) error {
		d := data(uint64(100+i), 1000+i*997)
		return b.Put(t.Context(), fmt.Sprintf("c/%02d", i), bytes.NewReader(d), int64(len(d)))
	})
	for i := range n {
		if got := get(t, b, fmt.Sprintf("c/%02d", i), 0, -1); !bytes.Equal(got, data(uint64(100+i), 1000+i*997)) {
			t.Errorf("object %d differs", i)
		}
	}
}

func testCancelled(t *testing.T, b objstore.Bucket) {
	put(t, b, "k", []byte("value"))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for op, err := range map[string]error{
		"put":    b.Put(ctx, "new", strings.NewReader("x"), 1),
		"get":    getErr(b.Get(ctx, "k", 0, -1)),
		"stat":   statErr(b.Stat(ctx, "k")),
		"delete": b.Delete(ctx, "k"),
		"list":   listErr(b.List(ctx, "")),
	} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %v", op, err)
		}
	}
	absent(t, b, "new")
	if got := get(t, b, "k", 0, -1); string(got) != "value" {
		t.Errorf("got %q", got)
	}
}

func listErr(_ []string, err error) error { return err }

// cancellingReader cancels its context once it has yielded after
// bytes, then goes on yielding zeros.
type cancellingReader struct {
	after  int
	cancel context.CancelFunc
}

func (r *cancellingReader) Read(p []byte) (int, error) {
	if r.after <= 0 {
		r.cancel()
	}
	clear(p)
	r.after -= len(p)
	return len(p), nil
}

func testCancelledDuringPut(t *testing.T, b objstore.Bucket) {
	for _, size := range []int64{1 << 20, 20 << 20} {
		ctx, cancel := context.WithCancel(t.Context())
		k := fmt.Sprintf("cancelled/%d", size)
		err := b.Put(ctx, k, io.LimitReader(&cancellingReader{after: int(size / 2), cancel: cancel}, size), size)
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("put of %d bytes cancelled half-way: %v", size, err)
		}
		absent(t, b, k)
	}
}

// testConditional: PutIf writes only over the version read, or only
// where there is no object, and ReadVersion names each content.
func testConditional(t *testing.T, b objstore.Bucket) {
	ctx := context.Background()
	changed := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, objstore.ErrChanged) || !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("%s: %v, want the object changed", what, err)
		}
	}
	if _, _, err := b.ReadVersion(ctx, "doc", 1<<10); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("version of a missing object: %v", err)
	}
	changed("put over a version of a missing object", b.PutIf(ctx, "doc", []byte("x"), "0123abcd"))
	absent(t, b, "doc")
	if err := b.PutIf(ctx, "doc", []byte("one"), ""); err != nil {
		t.Fatal(err)
	}
	changed("put where no object may be", b.PutIf(ctx, "doc", []byte("two"), ""))
	d, v1, err := b.ReadVersion(ctx, "doc", 1<<10)
	if err != nil || string(d) != "one" || v1 == "" {
		t.Fatalf("read: %q %q %v", d, v1, err)
	}
	if err := b.PutIf(ctx, "doc", []byte("three"), v1); err != nil {
		t.Fatal(err)
	}
	changed("put over a version replaced", b.PutIf(ctx, "doc", []byte("four"), v1))
	d, v3, err := b.ReadVersion(ctx, "doc", 1<<10)
	if err != nil || string(d) != "three" || v3 == v1 {
		t.Fatalf("after the puts: %q %q (first version %q) %v", d, v3, v1, err)
	}
	if _, _, err := b.ReadVersion(ctx, "doc", 4); err == nil {
		t.Fatal("a read of more than the bytes allowed succeeded")
	}
	// A plain put changes the version too.
	put(t, b, "doc", []byte("five"))
	changed("put over a version a plain put replaced", b.PutIf(ctx, "doc", []byte("six"), v3))
	if err := b.Delete(ctx, "doc"); err != nil {
		t.Fatal(err)
	}
	changed("put over a version of a deleted object", b.PutIf(ctx, "doc", []byte("seven"), v3))
	if err := b.PutIf(ctx, "doc", make([]byte, objstore.MaxConditional+1), ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a conditional put over the limit: %v", err)
	}
}

// testConditionalRace: of writers that read the same version and put
// over it at once, exactly one wins, and the object is its bytes.
func testConditionalRace(t *testing.T, b objstore.Bucket) {
	ctx := context.Background()
	if err := b.PutIf(ctx, "lease", []byte("start"), ""); err != nil {
		t.Fatal(err)
	}
	_, v, err := b.ReadVersion(ctx, "lease", 1<<10)
	if err != nil {
		t.Fatal(err)
	}
	const writers = 8
	errs := make([]error, writers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range writers {
		wg.Go(func() {
			<-start
			errs[i] = b.PutIf(ctx, "lease", []byte(fmt.Sprintf("writer %d", i)), v)
		})
	}
	close(start)
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil && won >= 0:
			t.Fatalf("writers %d and %d both won", won, i)
		case err == nil:
			won = i
		case !errors.Is(err, objstore.ErrChanged):
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	if won < 0 {
		t.Fatal("no writer won")
	}
	if d, _, err := b.ReadVersion(ctx, "lease", 1<<10); err != nil || string(d) != fmt.Sprintf("writer %d", won) {
		t.Fatalf("the object after the race: %q %v, want writer %d's", d, err, won)
	}
}
