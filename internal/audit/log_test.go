package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// fill opens a log in a new directory and appends n API entries.
func fill(t *testing.T, n int) (*Log, string) {
	t.Helper()
	dir := t.TempDir()
	l, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		if _, err := l.Append(Entry{Kind: KindAPI, Route: "POST /v1/sandboxes/{id}/rollback", Sandbox: fmt.Sprintf("sb-%d", i), Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	return l, dir
}

func lines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(b, []byte("\n"))
}

func write(t *testing.T, path string, ls [][]byte) {
	t.Helper()
	if err := os.WriteFile(path, bytes.Join(ls, nil), 0o600); err != nil {
		t.Fatal(err)
	}
}

// verifyFile verifies the file at path, against the anchor file next to
// it when anchored.
func verifyFile(t *testing.T, path string, anchored bool) Report {
	t.Helper()
	var a *Head
	if anchored {
		h, err := ReadAnchorFile(filepath.Join(filepath.Dir(path), AnchorName))
		if err != nil {
			t.Fatal(err)
		}
		a = &h
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return verify(f, a, false)
}

func wantBad(t *testing.T, r Report, seq uint64, problem string) {
	t.Helper()
	if r.OK {
		t.Fatalf("verified a tampered log: %+v", r)
	}
	if r.BadSeq != seq || !strings.Contains(r.Problem, problem) {
		t.Fatalf("first bad seq %d (%s), want %d (%q)", r.BadSeq, r.Problem, seq, problem)
	}
}

func TestVerifyIntact(t *testing.T) {
	l, dir := fill(t, 10)
	h := l.Head()
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	rep, err := l.Verify()
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Entries != 10 || rep.Head != h || rep.Anchor == nil || *rep.Anchor != h {
		t.Fatalf("report %+v, head %v", rep, h)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if r := verifyFile(t, filepath.Join(dir, FileName), true); !r.OK {
		t.Fatalf("offline: %+v", r)
	}
}

func TestEditedByteDetected(t *testing.T) {
	l, dir := fill(t, 10)
	l.Close()
	path := filepath.Join(dir, FileName)
	ls := lines(t, path)
	// sb-5 -> sb-6: still valid JSON, same length.
	ls[4] = bytes.Replace(ls[4], []byte(`"sb-5"`), []byte(`"sb-6"`), 1)
	write(t, path, ls)
	wantBad(t, verifyFile(t, path, false), 5, "hash mismatch")
}

func TestDeletedEntryDetected(t *testing.T) {
	l, dir := fill(t, 10)
	l.Close()
	path := filepath.Join(dir, FileName)
	ls := lines(t, path)
	write(t, path, append(ls[:4:4], ls[5:]...))
	wantBad(t, verifyFile(t, path, false), 5, "entries 5-5 are missing")
}

func TestSwappedEntriesDetected(t *testing.T) {
	l, dir := fill(t, 10)
	l.Close()
	path := filepath.Join(dir, FileName)
	ls := lines(t, path)
	ls[3], ls[4] = ls[4], ls[3]
	write(t, path, ls)
	wantBad(t, verifyFile(t, path, false), 4, "missing")
}

// rechain rewrites every line from i on so the chain holds again: what
// an editor who knows the hash rule does after changing line i.
func rechain(t *testing.T, ls [][]byte, from int) {
	t.Helper()
	prev := ZeroHash
	for i, ln := range ls {
		if len(ln) == 0 {
			continue
		}
		e, err := decode(bytes.TrimSuffix(ln, []byte("\n")))
		if i >= from {
			// decode refuses the edited line; take its fields as they are.
			if err != nil {
				e = Entry{}
				_ = jsonBody(ln, &e)
			}
			e.Seq, e.Prev = uint64(i+1), prev
			line, sum, err := encode(e)
			if err != nil {
				t.Fatal(err)
			}
			ls[i], e.Hash = line, sum
		} else if err != nil {
			t.Fatal(err)
		}
		prev = e.Hash
	}
}

// TestRewrittenTailCaughtByAnchor: reordering two entries and rehashing
// every entry after them makes a chain that holds; only the anchor tells.
func TestRewrittenTailCaughtByAnchor(t *testing.T) {
	l, dir := fill(t, 10)
	l.Close()
	path := filepath.Join(dir, FileName)
	ls := lines(t, path)
	ls[3], ls[4] = ls[4], ls[3]
	rechain(t, ls, 3)
	write(t, path, ls)
	if r := verifyFile(t, path, false); !r.OK {
		t.Fatalf("the rechained log should hold on its own: %+v", r)
	}
	wantBad(t, verifyFile(t, path, true), 10, "rewritten")
}

func TestTruncatedTailCaughtByAnchor(t *testing.T) {
	l, dir := fill(t, 10)
	l.Close()
	path := filepath.Join(dir, FileName)
	ls := lines(t, path)
	write(t, path, ls[:7])
	if r := verifyFile(t, path, false); !r.OK || r.Entries != 7 {
		t.Fatalf("a cut tail is not detectable from the file alone, yet: %+v", r)
	}
	wantBad(t, verifyFile(t, path, true), 8, "cut from the tail")

	// The daemon does not continue the chain over it: a new segment.
	l, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d := l.Damaged()
	if d == nil || !strings.Contains(d.Reason, "cut from the tail") {
		t.Fatalf("damage %+v", d)
	}
	if h := l.Head(); h.Seq != 1 {
		t.Fatalf("new segment's head %v, want seq 1", h)
	}
	rep, err := l.Verify()
	if err != nil || !rep.OK || !strings.Contains(rep.Segment, filepath.Base(d.Moved)) {
		t.Fatalf("new segment: %+v %v", rep, err)
	}
	if _, err := os.Stat(d.Moved); err != nil {
		t.Fatalf("the damaged segment is not kept: %v", err)
	}
}

// TestDamageStartsNewSegment: a bad line before the last is not cut nor
// chained over.
func TestDamageStartsNewSegment(t *testing.T) {
	l, dir := fill(t, 5)
	l.Close()
	path := filepath.Join(dir, FileName)
	ls := lines(t, path)
	ls[1] = bytes.Replace(ls[1], []byte(`"sb-2"`), []byte(`"sb-X"`), 1)
	write(t, path, ls)
	l, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if d := l.Damaged(); d == nil || d.Seq != 2 || !strings.Contains(d.Reason, "hash mismatch") {
		t.Fatalf("damage %+v", d)
	}
	e, err := l.Append(Entry{Kind: KindAPI, Route: "GET /v1/host", Status: 200})
	if err != nil || e.Seq != 2 {
		t.Fatalf("append after the new segment: %+v %v", e, err)
	}
}

func TestTornLastLineCut(t *testing.T) {
	l, dir := fill(t, 5)
	l.Close()
	path := filepath.Join(dir, FileName)
	// A crash in the middle of appending entry 6: part of its line.
	line, _, err := encode(Entry{Seq: 6, Prev: ZeroHash, Kind: KindAPI, Route: "GET /v1/host"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(line[:len(line)/2])
	f.Close()
	l, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if r := l.Repaired(); r == nil || r.Bytes != int64(len(line)/2) {
		t.Fatalf("repair %+v", r)
	}
	if d := l.Damaged(); d != nil {
		t.Fatalf("a torn last line taken for damage: %+v", d)
	}
	e, err := l.Append(Entry{Kind: KindAPI, Route: "GET /v1/host", Status: 200})
	if err != nil || e.Seq != 6 {
		t.Fatalf("append after the cut: %+v %v", e, err)
	}
	rep, err := l.Verify()
	if err != nil || !rep.OK || rep.Entries != 6 {
		t.Fatalf("%+v %v", rep, err)
	}
}

// TestConcurrentAppends: appends racing each other (and the async
// flush) keep one valid chain, every entry anchored by the end.
func TestConcurrentAppends(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const workers, each = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				e := Entry{Kind: KindEffect, Sandbox: fmt.Sprintf("w%d", w), Effect: fmt.Sprint(i)}
				var err error
				if i%2 == 0 {
					_, err = l.Append(e)
				} else {
					_, err = l.AppendAsync(e)
				}
				if err != nil {
					errs <- err
				}
				if i%10 == 0 {
					l.Head()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	h := l.Head()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	r := verifyFile(t, filepath.Join(dir, FileName), true)
	if !r.OK || r.Entries != workers*each || r.Head != h || *r.Anchor != h {
		t.Fatalf("%+v, head %v", r, h)
	}
}

func TestEntryBounded(t *testing.T) {
	l, _ := fill(t, 0)
	defer l.Close()
	huge := strings.Repeat("\x01\"é", 10000)
	e, err := l.Append(Entry{Kind: KindEffect, Host: huge, URLPath: huge, Note: huge, Sandbox: huge})
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Host) > maxField || len(e.Note) > maxNote || strings.ContainsRune(e.Host, 1) {
		t.Fatalf("not bounded: host %d bytes, note %d", len(e.Host), len(e.Note))
	}
	if rep, err := l.Verify(); err != nil || !rep.OK {
		t.Fatalf("%+v %v", rep, err)
	}
}

func jsonBody(line []byte, e *Entry) error {
	line = bytes.TrimSuffix(line, []byte("\n"))
	n := len(line) - hashSuffixLen
	return json.Unmarshal(append(line[:n:n], '}'), e)
}

// TestRehashedEntryBreaksLink: an entry edited and given its new hash
// verifies on its own; the next entry's prev no longer names it.
func TestRehashedEntryBreaksLink(t *testing.T) {
	l, dir := fill(t, 10)
	l.Close()
	path := filepath.Join(dir, FileName)
	ls := lines(t, path)
	e, err := decode(bytes.TrimSuffix(ls[4], []byte("\n")))
	if err != nil {
		t.Fatal(err)
	}
	e.Status = 500
	if ls[4], _, err = encode(e); err != nil {
		t.Fatal(err)
	}
	write(t, path, ls)
	wantBad(t, verifyFile(t, path, false), 6, "is not the hash of entry 5")
}

// TestGroupCommit: appends waiting at once share fdatasyncs.
func TestGroupCommit(t *testing.T) {
	l, _ := fill(t, 0)
	defer l.Close()
	const workers, each = 8, 20
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if _, err := l.Append(Entry{Kind: KindAPI, Route: "POST /v1/sandboxes"}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	l.syncMu.Lock()
	n := l.syncs
	l.syncMu.Unlock()
	t.Logf("%d appends, %d fdatasyncs", workers*each, n)
	if n >= workers*each {
		t.Fatalf("%d appends took %d fdatasyncs: none shared", workers*each, n)
	}
}
