package ledger

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fuzzPrefix is a valid file: three records (one pending, one finished,
// one replay), a rewind and a fork-style full record.
func fuzzPrefix() (data []byte, ids []string) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	recs := []Record{
		{ID: "00000000000000a1", Seq: 1, Sandbox: "sb", Kind: Effect, State: Pending, Request: Identity{Proto: "https", Method: "POST", URL: "https://pay.example/charge", BodyHash: "ab"}, Started: t0},
		{ID: "00000000000000a2", Seq: 2, Prev: "00000000000000a1", Sandbox: "sb", Kind: Effect, State: Pending, Request: Identity{Proto: "http", Method: "PUT", URL: "http://h/x"}, Started: t0},
		{ID: "00000000000000a3", Seq: 3, Prev: "00000000000000a1", Sandbox: "sb", Kind: Effect, State: Replayed, ReplayOf: "00000000000000a2", Started: t0, Finished: t0},
	}
	var b bytes.Buffer
	line := func(e entry) {
		l, err := encodeLine(e)
		if err != nil {
			panic(err)
		}
		b.Write(l)
	}
	line(entry{Op: opRec, Rec: &recs[0]})
	line(entry{Op: opRec, Rec: &recs[1]})
	line(entry{Op: opFin, ID: recs[1].ID, State: Completed, Response: &Response{Status: 200, Body: []byte("ok"), BodySize: 2}, Finished: t0})
	head := recs[0].ID
	line(entry{Op: opHead, Head: &head})
	line(entry{Op: opRec, Rec: &recs[2]})
	return b.Bytes(), []string{recs[0].ID, recs[1].ID, recs[2].ID}
}

// FuzzLedgerFile opens arbitrary file contents, alone or after a valid
// prefix. Open never panics; it fails only naming the file, never for a
// torn last line alone (data without a newline); when it succeeds the
// prefix's records are all there, the next Begin works and the file it
// leaves opens to the same state.
func FuzzLedgerFile(f *testing.F) {
	prefix, prefixIDs := fuzzPrefix()
	f.Add([]byte{}, true)
	f.Add(prefix, false)
	f.Add(prefix[:len(prefix)/2], false)
	f.Add([]byte("00000000 {}\n"), true)
	f.Fuzz(func(t *testing.T, data []byte, afterValid bool) {
		dir := t.TempDir()
		path := filepath.Join(dir, "sb.ledger")
		file := data
		if afterValid {
			file = append(bytes.Clone(prefix), data...)
		}
		if err := os.WriteFile(path, file, 0o600); err != nil {
			t.Fatal(err)
		}
		l, err := Open(dir)
		if err != nil {
			t.Fatalf("one sandbox's file failed the whole Open: %v", err)
		}
		defer l.Close()
		if err := l.Broken()["sb"]; err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name the file", err)
			}
			if afterValid && !bytes.Contains(data, []byte("\n")) {
				t.Fatalf("a valid prefix and a torn tail refused: %v", err)
			}
			if _, err := l.Begin("sb", Record{Kind: Read}); err == nil {
				t.Fatal("a refused file was written to")
			}
			return
		}
		list, err := l.List("sb", "")
		if err != nil {
			t.Fatal(err)
		}
		if afterValid {
			if len(list) < len(prefixIDs) {
				t.Fatalf("%d records, want the prefix's %d at least", len(list), len(prefixIDs))
			}
			for i, id := range prefixIDs {
				if list[i].ID != id {
					t.Fatalf("record %d is %s, want %s", i, list[i].ID, id)
				}
			}
			if !bytes.Contains(data, []byte("\n")) {
				if len(list) != len(prefixIDs) || l.Head("sb") != prefixIDs[2] {
					t.Fatalf("a torn tail changed the records: %d, head %s", len(list), l.Head("sb"))
				}
				if len(data) > 0 && (len(l.Repairs()) != 1 || l.Repairs()[0].Bytes != int64(len(data))) {
					t.Fatalf("repairs %+v, want %d bytes cut", l.Repairs(), len(data))
				}
			}
		}
		head := l.Head("sb")
		orphans := ids(l.Orphans("sb"))
		r, err := l.Begin("sb", Record{Kind: Read})
		if err != nil {
			t.Fatalf("Begin after Open: %v", err)
		}
		if r.Prev != head {
			t.Fatalf("new record follows %q, want the head %q", r.Prev, head)
		}
		l.Close()
		l2, err := Open(dir)
		if err != nil {
			t.Fatalf("reopen after Begin: %v", err)
		}
		defer l2.Close()
		list2, _ := l2.List("sb", "")
		if len(list2) != len(list)+1 || len(l2.Repairs()) != 0 || l2.Head("sb") != r.ID {
			t.Fatalf("reopen: %d records (want %d), repairs %+v, head %s", len(list2), len(list)+1, l2.Repairs(), l2.Head("sb"))
		}
		if o := ids(l2.Orphans("sb")); !equalStrings(o, orphans) {
			t.Fatalf("orphans %v after reopen, want %v", o, orphans)
		}
	})
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
