package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
)

func open(t testing.TB, dir string) *Ledger {
	t.Helper()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// post is the identity of a POST of body to path on pay.example.
func post(path, body string) Identity {
	return Canon{}.HTTP("https", "POST", "pay.example", &url.URL{Path: path}, jsonHeader(), []byte(body))
}

func get(path string) Identity {
	return Canon{}.HTTP("https", "GET", "pay.example", &url.URL{Path: path}, nil, nil)
}

func begin(t testing.TB, l *Ledger, sb string, r Record) Record {
	t.Helper()
	r, err := l.Begin(sb, r)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// effect records a completed effect with a response.
func effect(t testing.TB, l *Ledger, sb string, id Identity, status int) Record {
	t.Helper()
	r := begin(t, l, sb, Record{Kind: Effect, Request: id})
	r, err := l.Finish(sb, r.ID, Completed, &Response{Status: status, Body: []byte(fmt.Sprintf(`{"status":%d}`, status)), BodySize: 14}, "")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func ids(rs []Record) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

func TestBeginFields(t *testing.T) {
	l := open(t, t.TempDir())
	a := begin(t, l, "sb-1", Record{Kind: Effect, Request: post("/charge", `{"a":1}`)})
	if len(a.ID) != 16 || strings.Trim(a.ID, "0123456789abcdef") != "" {
		t.Fatalf("ID %q: want 16 hex digits", a.ID)
	}
	if a.Seq != 1 || a.Prev != "" || a.Sandbox != "sb-1" || a.State != Pending || a.Started.IsZero() || !a.Finished.IsZero() {
		t.Fatalf("first record %+v", a)
	}
	d := begin(t, l, "sb-1", Record{Kind: Effect, State: Denied, Request: post("/x", "")})
	if d.Seq != 2 || d.Prev != a.ID || d.Finished.IsZero() {
		t.Fatalf("second record %+v: want seq 2 after %s, finished", d, a.ID)
	}
	if h := l.Head("sb-1"); h != d.ID {
		t.Fatalf("head %s, want %s", h, d.ID)
	}
	if got, ok := l.Get("sb-1", a.ID); !ok || got.ID != a.ID || got.State != Pending {
		t.Fatalf("Get = %+v, %v", got, ok)
	}
	if _, err := l.Finish("sb-1", d.ID, Completed, nil, ""); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("finishing a denied record: %v", err)
	}
	if _, err := l.Finish("sb-1", "0123456789abcdef", Completed, nil, ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("finishing an unknown record: %v", err)
	}
	if _, err := l.Finish("sb-1", a.ID, Replayed, nil, ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("finishing as replayed: %v", err)
	}
	f, err := l.Finish("sb-1", a.ID, Failed, nil, "connection refused")
	if err != nil || f.State != Failed || f.Error != "connection refused" || f.Finished.IsZero() {
		t.Fatalf("Finish = %+v, %v", f, err)
	}
	if _, err := l.Finish("sb-1", a.ID, Completed, nil, ""); err == nil {
		t.Fatal("a record finished twice")
	}
	if _, err := l.Begin("sb-1", Record{Kind: "bogus"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a record of an unknown kind: %v", err)
	}
	if _, err := l.Begin("sb-1", Record{Kind: Effect, State: Replayed, ReplayOf: "nope"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a replay of an unknown record: %v", err)
	}
	for _, bad := range []string{"", "../x", "A", "a/b", ".", strings.Repeat("a", 65), "a b"} {
		if _, err := l.Begin(bad, Record{Kind: Read}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("sandbox %q: %v", bad, err)
		}
	}
	if got := l.Sandboxes(); !reflect.DeepEqual(got, []string{"sb-1"}) {
		t.Fatalf("Sandboxes = %v", got)
	}
	list, err := l.List("sb-1", a.ID)
	if err != nil || !reflect.DeepEqual(ids(list), []string{d.ID}) {
		t.Fatalf("List after %s = %v, %v", a.ID, ids(list), err)
	}
	if _, err := l.List("sb-1", "0123456789abcdef"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("List after an unknown record: %v", err)
	}
}

func TestLineModel(t *testing.T) {
	l := open(t, t.TempDir())
	const sb = "agent"
	e1 := effect(t, l, sb, post("/charge", `{"amount":1}`), 200)
	begin(t, l, sb, Record{Kind: Read, State: Completed, Request: get("/balance")})
	ck := l.Head(sb) // a checkpoint taken here
	e2 := effect(t, l, sb, post("/charge", `{"amount":2}`), 201)
	e3 := effect(t, l, sb, post("/email", `{"to":"x"}`), 202)
	if m := l.Match(sb, post("/charge", `{"amount":2}`)); m.Orphan != nil || m.Pending != nil || m.Orphans != 0 {
		t.Fatalf("before the rollback: %+v, want nothing", m)
	}

	if err := l.Rewind(sb, ck); err != nil {
		t.Fatal(err)
	}
	if l.Head(sb) != ck {
		t.Fatalf("head %s after rewind, want %s", l.Head(sb), ck)
	}
	if got := ids(l.Orphans(sb)); !reflect.DeepEqual(got, []string{e2.ID, e3.ID}) {
		t.Fatalf("orphans %v, want %v", got, []string{e2.ID, e3.ID})
	}
	// e1 is still on the line: not an orphan.
	if m := l.Match(sb, post("/charge", `{"amount":1}`)); m.Orphan != nil || m.Orphans != 2 {
		t.Fatalf("match of e1: %+v", m)
	}
	m := l.Match(sb, post("/charge", ` {"amount": 2} `))
	if m.Orphan == nil || m.Orphan.ID != e2.ID || m.Orphan.Response.Status != 201 || m.Pending != nil || m.Orphans != 2 {
		t.Fatalf("match of e2 after the rollback: %+v", m)
	}
	// A request that matches nothing while orphans remain is divergent.
	if m := l.Match(sb, post("/charge", `{"amount":3}`)); m.Orphan != nil || m.Orphans != 2 {
		t.Fatalf("divergent request: %+v", m)
	}

	rp := begin(t, l, sb, Record{Kind: Effect, State: Replayed, ReplayOf: e2.ID, Request: post("/charge", `{"amount":2}`), Response: m.Orphan.Response})
	if rp.Prev != ck || rp.Finished.IsZero() {
		t.Fatalf("replay record %+v", rp)
	}
	if m := l.Match(sb, post("/charge", `{"amount":2}`)); m.Orphan != nil || m.Orphans != 1 {
		t.Fatalf("second identical request: %+v, want no orphan and one left", m)
	}
	if got := ids(l.Orphans(sb)); !reflect.DeepEqual(got, []string{e3.ID}) {
		t.Fatalf("orphans %v, want only e3", got)
	}
	// Rewinding past the replay orphans e2 again.
	if err := l.Rewind(sb, ck); err != nil {
		t.Fatal(err)
	}
	if m := l.Match(sb, post("/charge", `{"amount":2}`)); m.Orphan == nil || m.Orphan.ID != e2.ID || m.Orphans != 2 {
		t.Fatalf("after a second rollback: %+v", m)
	}
	// Rewinding to the start orphans e1 as well; unknown heads are refused.
	if err := l.Rewind(sb, ""); err != nil || l.Head(sb) != "" {
		t.Fatalf("rewind to the start: %v, head %q", err, l.Head(sb))
	}
	if m := l.Match(sb, post("/charge", `{"amount":1}`)); m.Orphan == nil || m.Orphan.ID != e1.ID || m.Orphans != 3 {
		t.Fatalf("after a rewind to the start: %+v", m)
	}
	if err := l.Rewind(sb, "0123456789abcdef"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("rewind to an unknown record: %v", err)
	}
}

func TestMatchEarliestOrphan(t *testing.T) {
	l := open(t, t.TempDir())
	const sb = "agent"
	first := effect(t, l, sb, post("/charge", `{"a":1}`), 200)
	effect(t, l, sb, post("/charge", `{"a":1}`), 201)
	// Opaque and failed effects are never answered from.
	begin(t, l, sb, Record{Kind: Opaque, State: Completed, Request: Identity{Proto: "tls", Host: "pay.example", Addr: "192.0.2.1:443"}})
	failed := begin(t, l, sb, Record{Kind: Effect, Request: post("/refund", `{}`)})
	if _, err := l.Finish(sb, failed.ID, Failed, nil, "reset"); err != nil {
		t.Fatal(err)
	}
	if err := l.Rewind(sb, ""); err != nil {
		t.Fatal(err)
	}
	m := l.Match(sb, post("/charge", `{"a":1}`))
	if m.Orphan == nil || m.Orphan.ID != first.ID || m.Orphans != 3 {
		t.Fatalf("match %+v: want the earliest, %s, and 3 orphans (2 effects, 1 opaque)", m, first.ID)
	}
	if m := l.Match(sb, Identity{Proto: "tls", Host: "pay.example", Addr: "192.0.2.1:443"}); m.Orphan != nil {
		t.Fatalf("an opaque orphan answered: %+v", m)
	}
	if m := l.Match(sb, post("/refund", `{}`)); m.Orphan != nil || m.Pending != nil {
		t.Fatalf("a failed effect matched: %+v", m)
	}
}

func TestPendingMatch(t *testing.T) {
	l := open(t, t.TempDir())
	const sb = "agent"
	p := begin(t, l, sb, Record{Kind: Effect, Request: post("/charge", `{"a":1}`)})
	m := l.Match(sb, post("/charge", `{"a":1}`))
	if m.Pending == nil || m.Pending.ID != p.ID || m.Orphan != nil {
		t.Fatalf("match of a pending effect on the line: %+v", m)
	}
	if err := l.Rewind(sb, ""); err != nil {
		t.Fatal(err)
	}
	m = l.Match(sb, post("/charge", `{"a":1}`))
	if m.Pending == nil || m.Pending.ID != p.ID || m.Orphan != nil || m.Orphans != 1 {
		t.Fatalf("match of an orphaned pending effect: %+v", m)
	}
	// A pending read is no reason to refuse anything.
	begin(t, l, sb, Record{Kind: Read, Request: get("/x")})
	if m := l.Match(sb, get("/x")); m.Pending != nil {
		t.Fatalf("a pending read matched: %+v", m)
	}
	if _, err := l.Finish(sb, p.ID, Failed, nil, "never sent"); err != nil {
		t.Fatal(err)
	}
	if m := l.Match(sb, post("/charge", `{"a":1}`)); m.Pending != nil || m.Orphan != nil || m.Orphans != 0 {
		t.Fatalf("after the pending effect failed: %+v", m)
	}
}

func TestFork(t *testing.T) {
	l := open(t, t.TempDir())
	e1 := effect(t, l, "parent", post("/a", "1"), 200)
	e2 := effect(t, l, "parent", post("/b", "2"), 200)
	if err := l.Fork("parent", "child", e1.ID); err != nil {
		t.Fatal(err)
	}
	e3 := effect(t, l, "parent", post("/c", "3"), 200)

	if l.Head("child") != e1.ID || l.Head("parent") != e3.ID {
		t.Fatalf("heads: child %s parent %s", l.Head("child"), l.Head("parent"))
	}
	list, err := l.List("child", "")
	if err != nil || !reflect.DeepEqual(ids(list), []string{e1.ID, e2.ID}) {
		t.Fatalf("child's records %v, %v: want the parent's at the fork", ids(list), err)
	}
	for _, r := range list {
		if r.Origin != "parent" || r.Sandbox != "child" || r.State != Completed {
			t.Fatalf("child's copy %+v", r)
		}
	}
	// The fork is at e1: e2 is the child's orphan, e3 it never saw.
	if m := l.Match("child", post("/b", "2")); m.Orphan == nil || m.Orphan.ID != e2.ID || m.Orphans != 1 {
		t.Fatalf("child's match of e2: %+v", m)
	}
	if m := l.Match("child", post("/c", "3")); m.Orphan != nil {
		t.Fatalf("child sees the parent's later record: %+v", m)
	}
	if m := l.Match("parent", post("/b", "2")); m.Orphan != nil || m.Orphans != 0 {
		t.Fatalf("parent: %+v", m)
	}
	c1 := begin(t, l, "child", Record{Kind: Effect, State: Replayed, ReplayOf: e2.ID, Request: post("/b", "2")})
	if c1.Seq != 3 || c1.Prev != e1.ID || c1.Origin != "" {
		t.Fatalf("child's own record %+v", c1)
	}
	if m := l.Match("child", post("/b", "2")); m.Orphan != nil || m.Orphans != 0 {
		t.Fatalf("child after the replay: %+v", m)
	}
	// A grandchild keeps the original writer as Origin.
	if err := l.Fork("child", "grandchild", ""); err != nil {
		t.Fatal(err)
	}
	gl, _ := l.List("grandchild", "")
	if len(gl) != 3 || gl[0].Origin != "parent" || gl[2].Origin != "child" || l.Head("grandchild") != "" {
		t.Fatalf("grandchild's records %+v head %q", gl, l.Head("grandchild"))
	}
	if got := l.Match("grandchild", post("/a", "1")); got.Orphans != 2 {
		t.Fatalf("grandchild at the start: %+v, want e1 and e2 orphaned", got)
	}

	if err := l.Fork("parent", "child", ""); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("fork onto an existing ledger: %v", err)
	}
	if err := l.Fork("parent", "other", "0123456789abcdef"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("fork at an unknown record: %v", err)
	}
	if _, ok := l.Get("other", e1.ID); ok || slicesContains(l.Sandboxes(), "other") {
		t.Fatal("a failed fork left a ledger")
	}
	if err := l.Fork("nobody", "empty", ""); err != nil || l.Head("empty") != "" || !slicesContains(l.Sandboxes(), "empty") {
		t.Fatalf("fork of a sandbox without a ledger: %v", err)
	}
	if err := l.Fork("parent", "parent", ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("fork onto itself: %v", err)
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// snapshot is everything a Ledger tells about its sandboxes.
type snapshot struct {
	Heads   map[string]string
	Records map[string][]Record
	Orphans map[string][]string
}

func snap(t *testing.T, l *Ledger) snapshot {
	t.Helper()
	s := snapshot{Heads: map[string]string{}, Records: map[string][]Record{}, Orphans: map[string][]string{}}
	for _, sb := range l.Sandboxes() {
		s.Heads[sb] = l.Head(sb)
		rs, err := l.List(sb, "")
		if err != nil {
			t.Fatal(err)
		}
		s.Records[sb] = rs
		s.Orphans[sb] = ids(l.Orphans(sb))
	}
	return s
}

func TestReopen(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	e1 := effect(t, l, "a", post("/1", "1"), 200)
	begin(t, l, "a", Record{Kind: Read, State: Completed, Request: get("/r"), Turn: 3, Checkpoint: "ck1",
		Response: &Response{Status: 200, Header: map[string][]string{"X": {"y"}}, Body: []byte{0, 1, 2}, BodySize: 3}})
	e2 := effect(t, l, "a", post("/2", "2"), 200)
	pend := begin(t, l, "a", Record{Kind: Effect, Request: post("/3", "3")})
	begin(t, l, "a", Record{Kind: Effect, State: Completed, Declared: true, Request: Identity{Proto: "declared", Method: "send_email"},
		Compensator: &Compensator{Method: "POST", URL: "https://mail.example/undo", Body: []byte("{}")}})
	if err := l.Fork("a", "b", e2.ID); err != nil {
		t.Fatal(err)
	}
	if err := l.Rewind("a", e1.ID); err != nil {
		t.Fatal(err)
	}
	begin(t, l, "a", Record{Kind: Effect, State: Replayed, ReplayOf: e2.ID, Request: post("/2", "2")})
	if err := l.Rewind("b", ""); err != nil {
		t.Fatal(err)
	}
	begin(t, l, "c", Record{Kind: Read, Request: get("/pending-read")})
	before := snap(t, l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Begin("a", Record{Kind: Read}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Begin after Close: %v", err)
	}

	l2 := open(t, dir)
	if len(l2.Repairs()) != 0 {
		t.Fatalf("repairs of a clean file: %+v", l2.Repairs())
	}
	after := snap(t, l2)
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("state after reopen differs:\nbefore %+v\nafter  %+v", before, after)
	}
	if len(before.Orphans["a"]) == 0 || len(before.Orphans["b"]) == 0 {
		t.Fatalf("the test wants orphans in both ledgers: %+v", before.Orphans)
	}
	if m := l2.Match("a", post("/3", "3")); m.Pending == nil || m.Pending.ID != pend.ID {
		t.Fatalf("pending record after reopen: %+v", m)
	}
	if m := l2.Match("b", post("/2", "2")); m.Orphan == nil || m.Orphan.ID != e2.ID {
		t.Fatalf("fork's orphan after reopen: %+v", m)
	}
	next := begin(t, l2, "a", Record{Kind: Read, Request: get("/next")})
	if n := len(before.Records["a"]); next.Seq != before.Records["a"][n-1].Seq+1 {
		t.Fatalf("seq after reopen %d", next.Seq)
	}
}

func TestRemove(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	effect(t, l, "gone", post("/1", "1"), 200)
	if err := l.Remove("gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "gone.ledger")); !os.IsNotExist(err) {
		t.Fatalf("file after Remove: %v", err)
	}
	if len(l.Sandboxes()) != 0 || l.Head("gone") != "" {
		t.Fatal("ledger listed after Remove")
	}
	if err := l.Remove("gone"); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	// A new ledger under the same name starts over.
	if r := begin(t, l, "gone", Record{Kind: Read}); r.Seq != 1 {
		t.Fatalf("seq %d after Remove", r.Seq)
	}
}

// appendRaw appends b to sb's file under dir.
func appendRaw(t *testing.T, dir, sb string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, sb+".ledger"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

func TestTornTail(t *testing.T) {
	line, err := encodeLine(entry{Op: opRec, Rec: &Record{ID: "ffffffffffffffff", Seq: 9, Kind: Effect, State: Pending}})
	if err != nil {
		t.Fatal(err)
	}
	badCRC := bytes.Clone(line)
	badCRC[0] ^= 1
	for _, c := range []struct {
		name string
		tail []byte
	}{
		{"half a line", line[:len(line)/2]},
		{"all but the newline", line[:len(line)-1]},
		{"bad checksum", badCRC},
		{"zeros", make([]byte, 100)},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			l, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			e1 := effect(t, l, "sb", post("/1", "1"), 200)
			e2 := begin(t, l, "sb", Record{Kind: Effect, Request: post("/2", "2")})
			l.Close()
			path := filepath.Join(dir, "sb.ledger")
			st, _ := os.Stat(path)
			appendRaw(t, dir, "sb", c.tail)

			l = open(t, dir)
			want := []Repair{{Sandbox: "sb", Path: path, Offset: st.Size(), Bytes: int64(len(c.tail))}}
			if got := l.Repairs(); !reflect.DeepEqual(got, want) {
				t.Fatalf("Repairs = %+v, want %+v", got, want)
			}
			if fi, _ := os.Stat(path); fi.Size() != st.Size() {
				t.Fatalf("file is %d bytes after the repair, want %d", fi.Size(), st.Size())
			}
			list, _ := l.List("sb", "")
			if !reflect.DeepEqual(ids(list), []string{e1.ID, e2.ID}) || list[0].State != Completed || list[1].State != Pending {
				t.Fatalf("records after the repair: %+v", list)
			}
			e3 := begin(t, l, "sb", Record{Kind: Effect, Request: post("/3", "3")})
			if e3.Seq != 3 || e3.Prev != e2.ID {
				t.Fatalf("record after the repair %+v", e3)
			}
			l.Close()
			l = open(t, dir)
			if list, _ := l.List("sb", ""); len(list) != 3 || len(l.Repairs()) != 0 {
				t.Fatalf("after a second reopen: %d records, repairs %+v", len(list), l.Repairs())
			}
		})
	}
}

func TestCorruptMiddleRefused(t *testing.T) {
	for _, c := range []struct {
		name   string
		damage func(lines [][]byte)
		want   string
	}{
		{"flipped byte", func(lines [][]byte) { lines[1][20] ^= 0x20 }, "line 2: checksum mismatch"},
		{"cut line", func(lines [][]byte) { lines[1] = append(lines[1][:30:30], '\n') }, "line 2:"},
		{"empty line", func(lines [][]byte) { lines[1] = []byte("\n") }, "line 2: not a ledger line"},
		// Checksummed but not fitting: never written by Ledger, refused.
		{"finish of nothing", func(lines [][]byte) {
			l, _ := encodeLine(entry{Op: opFin, ID: "0000000000000000", State: Completed})
			lines[2] = l
		}, "line 3: finish of unknown record"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			l, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			effect(t, l, "sb", post("/1", "1"), 200) // lines 1, 2
			effect(t, l, "sb", post("/2", "2"), 200) // lines 3, 4
			effect(t, l, "ok", post("/1", "1"), 200)
			l.Close()
			path := filepath.Join(dir, "sb.ledger")
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			lines := bytes.SplitAfter(b, []byte("\n"))
			c.damage(lines)
			if err := os.WriteFile(path, bytes.Join(lines, nil), 0o600); err != nil {
				t.Fatal(err)
			}
			l2, err := Open(dir)
			if err != nil {
				t.Fatalf("one damaged ledger kept the others from opening: %v", err)
			}
			defer l2.Close()
			err = l2.Broken()["sb"]
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("broken: %v: want the file %s and %q", err, path, c.want)
			}
			// The damaged sandbox records nothing, the other goes on.
			if _, err := l2.Begin("sb", Record{Kind: Effect, Request: post("/3", "3")}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("begin on a damaged ledger: %v", err)
			}
			if _, err := l2.List("sb", ""); err == nil {
				t.Fatal("a damaged ledger was listed")
			}
			if _, err := l2.Begin("ok", Record{Kind: Effect, Request: post("/3", "3")}); err != nil {
				t.Fatalf("begin on a sound ledger beside a damaged one: %v", err)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(after, bytes.Join(lines, nil)) {
				t.Fatal("the corrupt file was changed")
			}
			// Removing the sandbox removes its damaged file.
			if err := l2.Remove("sb"); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("damaged file after Remove: %v", err)
			}
		})
	}
}

func TestConcurrentBegin(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	const workers, each = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				k := Read
				if i%4 == 0 {
					k = Effect
				}
				r, err := l.Begin("busy", Record{Kind: k, Request: post(fmt.Sprintf("/%d/%d", w, i), "x")})
				if err == nil && k == Effect {
					_, err = l.Finish("busy", r.ID, Completed, &Response{Status: 200}, "")
				}
				if err == nil && i%10 == 0 {
					// Other sandboxes are written at the same time.
					_, err = l.Begin(fmt.Sprintf("side-%d", w), Record{Kind: Effect, State: Completed, Request: get("/")})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	check := func(l *Ledger) {
		t.Helper()
		list, err := l.List("busy", "")
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != workers*each {
			t.Fatalf("%d records, want %d", len(list), workers*each)
		}
		seen := map[string]bool{}
		for i, r := range list {
			if r.Seq != uint64(i+1) || seen[r.ID] {
				t.Fatalf("record %d: seq %d id %s (dup %v)", i, r.Seq, r.ID, seen[r.ID])
			}
			seen[r.ID] = true
			if i > 0 && r.Prev != list[i-1].ID {
				t.Fatalf("record %d follows %s, want %s", i, r.Prev, list[i-1].ID)
			}
		}
	}
	check(l)
	before := snap(t, l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, dir)
	check(l)
	if after := snap(t, l); !reflect.DeepEqual(before, after) {
		t.Fatal("state after reopen differs")
	}
}

// TestReadGroupCommit checks that a read's line reaches the disk without
// another write to push it.
func TestReadGroupCommit(t *testing.T) {
	l := open(t, t.TempDir())
	begin(t, l, "sb", Record{Kind: Read, Request: get("/")})
	s := l.peek("sb")
	want := s.written.Load()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.syncMu.Lock()
		synced := s.synced
		s.syncMu.Unlock()
		if synced >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("synced %d of %d appends after 5s", synced, want)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestOpenIgnoresOtherFiles(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{
		"README":           "not a ledger",
		"UPPER.ledger":     "garbage\n",
		".half.ledger.tmp": "a fork that crashed",
		"a.b.ledger":       "garbage\n",
		"x.ledger.bak":     "garbage\n",
		"z" + strings.Repeat("z", 64) + ".ledger": "garbage\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l := open(t, dir)
	if len(l.Sandboxes()) != 0 {
		t.Fatalf("sandboxes %v", l.Sandboxes())
	}
	if _, err := os.Stat(filepath.Join(dir, ".half.ledger.tmp")); !os.IsNotExist(err) {
		t.Fatalf("a crashed fork's temporary file was left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "README")); err != nil {
		t.Fatal("a file that is not the ledger's was removed")
	}
	sub := filepath.Join(t.TempDir(), "new", "ledger")
	open(t, sub)
	if fi, err := os.Stat(sub); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("created directory: %v %v", fi.Mode(), err)
	}
}

// TestConcurrentMixed runs every operation at once on shared sandboxes
// (run it under -race): no error but the expected ones, and what the
// Ledger holds at the end is what reopening its files gives.
func TestConcurrentMixed(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	first := effect(t, l, "p", post("/0", "0"), 200)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	for w := range 4 {
		wg.Go(func() {
			for i := range 30 {
				r, err := l.Begin("p", Record{Kind: Effect, Request: post(fmt.Sprintf("/%d/%d", w, i), "x")})
				if err != nil {
					fail(err)
					return
				}
				if _, err := l.Finish("p", r.ID, Completed, &Response{Status: 200}, ""); err != nil {
					fail(err)
					return
				}
				l.Match("p", post(fmt.Sprintf("/%d/%d", w, i-1), "x"))
			}
		})
	}
	wg.Go(func() {
		for i := range 20 {
			if err := l.Rewind("p", first.ID); err != nil {
				fail(err)
				return
			}
			child := fmt.Sprintf("c-%d", i)
			if err := l.Fork("p", child, first.ID); err != nil {
				fail(err)
				return
			}
			if _, err := l.Begin(child, Record{Kind: Read}); err != nil {
				fail(err)
				return
			}
			l.Orphans(child)
			l.Sandboxes()
			if i%2 == 0 {
				if err := l.Remove(child); err != nil {
					fail(err)
					return
				}
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	before := snap(t, l)
	if len(before.Heads) != 11 {
		t.Fatalf("sandboxes %v, want p and 10 forks", l.Sandboxes())
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, dir)
	if after := snap(t, l); !reflect.DeepEqual(before, after) {
		t.Fatal("state after reopen differs")
	}
}

// TestConsumeAndWouldOrphan: consumers persist; a rewind's orphans are
// the committed records after it on the current line, replays counted
// as on the line.
func TestConsumeAndWouldOrphan(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a := effect(t, l, "sb", post("/a", "1"), 200)
	ck := l.Head("sb")
	b := effect(t, l, "sb", post("/b", "2"), 200)
	if _, err := l.Begin("sb", Record{Kind: Read, State: Completed, Request: Identity{Proto: "http", Method: "GET", URL: "http://x/r"}}); err != nil {
		t.Fatal(err)
	}
	c := effect(t, l, "sb", post("/c", "3"), 200)
	if _, err := l.Consume("sb", b.ID, Consumer{By: "billing", Note: "invoiced"}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Consume("sb", b.ID, Consumer{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a consumer without a name: %v", err)
	}
	if sb, ok := l.Find(c.ID); !ok || sb != "sb" {
		t.Fatalf("find %s: %q %v", c.ID, sb, ok)
	}
	got, err := l.WouldOrphan("sb", ck)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != b.ID || got[1].ID != c.ID || len(got[0].Consumers) != 1 || got[0].Consumers[0].By != "billing" {
		t.Fatalf("would orphan %+v, want b (consumed by billing) and c", got)
	}
	if got, _ := l.WouldOrphan("sb", l.Head("sb")); len(got) != 0 {
		t.Fatalf("a rewind to the head orphans %+v", got)
	}
	if _, err := l.WouldOrphan("sb", "ffffffffffffffff"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown head: %v", err)
	}
	// Reopened, the consumer is there; a fork's copy is not Find's.
	l.Close()
	l, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if r, _ := l.Get("sb", b.ID); len(r.Consumers) != 1 || r.Consumers[0].Note != "invoiced" {
		t.Fatalf("after reopen: %+v", r)
	}
	if err := l.Fork("sb", "child", ck); err != nil {
		t.Fatal(err)
	}
	if sb, _ := l.Find(a.ID); sb != "sb" {
		t.Fatalf("find %s: %q, want the sandbox that wrote it", a.ID, sb)
	}
}
