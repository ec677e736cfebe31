package ledger

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// undoable records a completed effect with an HTTP compensator.
func undoable(t *testing.T, l *Ledger, sb, path string, deps *[]string) Record {
	t.Helper()
	r := begin(t, l, sb, Record{Kind: Effect, Request: post(path, `{}`), DependsOn: deps,
		Compensator: &Compensator{Method: "POST", URL: "https://pay.example/refund" + path}})
	r, err := l.Finish(sb, r.ID, Completed, &Response{Status: 200}, "")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// recorder is a compensator function that fails for the paths in fail
// (every attempt) and remembers what it was asked, in order.
type recorder struct {
	mu    sync.Mutex
	calls []string
	fail  map[string]bool
}

func (rc *recorder) run(_ context.Context, r Record, attempt int) error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.calls = append(rc.calls, r.Request.URL)
	if rc.fail[r.Request.URL] {
		return errors.New("503 from the service")
	}
	return nil
}

func TestCompensateOrderAndDependentFailure(t *testing.T) {
	l := open(t, t.TempDir())
	const sb = "sb"
	base := effect(t, l, sb, get("/x"), 200) // a read: the checkpoint's head
	_ = base
	head := l.Head(sb)
	a := undoable(t, l, sb, "/a", &[]string{})      // independent
	b := undoable(t, l, sb, "/b", &[]string{})      // independent
	c := undoable(t, l, sb, "/c", &[]string{b.ID})  // depends on b
	d := undoable(t, l, sb, "/d", &[]string{c.ID})  // depends on c: fails
	e := undoable(t, l, sb, "/e", &[]string{a.ID})  // depends on a
	batch := []string{a.ID, b.ID, c.ID, d.ID, e.ID} // as the plan lists them
	if err := l.Plan(sb, "ck", "batch1", batch); err != nil {
		t.Fatal(err)
	}
	// Planned effects are not replayed nor re-sent meanwhile.
	if m := l.Match(sb, post("/a", `{}`)); m.Pending == nil || m.Pending.ID != a.ID {
		t.Fatalf("a planned compensation must match as pending: %+v", m)
	}
	if err := l.Rewind(sb, head); err != nil {
		t.Fatal(err)
	}
	rc := &recorder{fail: map[string]bool{d.Request.URL: true}}
	out, err := l.Run(context.Background(), sb, "batch1", RunOptions{Attempts: 3, Backoff: time.Millisecond}, rc.run)
	if err != nil {
		t.Fatal(err)
	}
	// Reverse order, dependents first; d tried 3 times; c and b not
	// tried (d depends on c, c on b); a and e compensated.
	want := []string{e.Request.URL, d.Request.URL, d.Request.URL, d.Request.URL, a.Request.URL}
	if !slices.Equal(rc.calls, want) {
		t.Fatalf("compensators ran %v, want %v", rc.calls, want)
	}
	got := map[string]Outcome{}
	for _, o := range out {
		got[o.ID] = o
	}
	for _, x := range []struct {
		id    string
		state CompState
		err   string
	}{{a.ID, CompDone, ""}, {e.ID, CompDone, ""}, {d.ID, CompFailed, "3 attempt(s), the last: 503"},
		{c.ID, CompFailed, "dependent " + d.ID + "'s compensation failed"}, {b.ID, CompFailed, "dependent " + c.ID + "'s compensation failed"}} {
		o := got[x.id]
		r, _ := l.Get(sb, x.id)
		if o.State != x.state || !strings.HasPrefix(o.Error, x.err) || r.Compensation.State != x.state || r.Compensation.Error != o.Error {
			t.Errorf("%s: outcome %+v, record %+v; want %s %q", x.id, o, r.Compensation, x.state, x.err)
		}
	}
	// Compensated effects are no longer orphans; failed ones are.
	orph := ids(l.Orphans(sb))
	if want := []string{b.ID, c.ID, d.ID}; !slices.Equal(orph, want) {
		t.Fatalf("orphans %v, want %v", orph, want)
	}
	// A compensated effect is not answered from the ledger: a new
	// request is sent; a failed one still is.
	if m := l.Match(sb, post("/a", `{}`)); m.Orphan != nil || m.Pending != nil {
		t.Fatalf("a compensated effect matched: %+v", m)
	}
	if m := l.Match(sb, post("/d", `{}`)); m.Orphan == nil || m.Orphan.ID != d.ID {
		t.Fatalf("a failed compensation's effect must still replay: %+v", m)
	}
	// All of it survives a reopen.
	before := snapComp(t, l, sb)
	l.Close()
	l2 := open(t, l.dir)
	if after := snapComp(t, l2, sb); !reflect.DeepEqual(before, after) {
		t.Fatalf("after reopen %v, before %v", after, before)
	}
}

func snapComp(t *testing.T, l *Ledger, sb string) map[string]Compensation {
	t.Helper()
	rs, err := l.List(sb, "")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Compensation{}
	for _, r := range rs {
		if r.Compensation != nil {
			out[r.ID] = *r.Compensation
		}
	}
	return out
}

// Without DependsOn, a later effect may depend on every earlier one: a
// failure stops the compensation of everything before it.
func TestCompensateImplicitOrder(t *testing.T) {
	l := open(t, t.TempDir())
	const sb = "sb"
	a := undoable(t, l, sb, "/a", nil)
	b := undoable(t, l, sb, "/b", nil)
	c := undoable(t, l, sb, "/c", nil)
	if err := l.Plan(sb, "ck", "b1", []string{a.ID, b.ID, c.ID}); err != nil {
		t.Fatal(err)
	}
	rc := &recorder{fail: map[string]bool{b.Request.URL: true}}
	if _, err := l.Run(context.Background(), sb, "b1", RunOptions{Attempts: 1}, rc.run); err != nil {
		t.Fatal(err)
	}
	if want := []string{c.Request.URL, b.Request.URL}; !slices.Equal(rc.calls, want) {
		t.Fatalf("ran %v, want %v", rc.calls, want)
	}
	if r, _ := l.Get(sb, a.ID); r.Compensation.State != CompFailed || r.Compensation.Error != "dependent "+b.ID+"'s compensation failed" {
		t.Fatalf("a: %+v", r.Compensation)
	}
}

// An attempt a crash interrupted (an intent without an outcome) is run
// again by the next Run, even past the limit, and retried attempts back
// off exponentially.
func TestCompensateResumeAndBackoff(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	const sb = "sb"
	a := undoable(t, l, sb, "/a", nil)
	if err := l.Plan(sb, "ck", "b1", []string{a.ID}); err != nil {
		t.Fatal(err)
	}
	// A daemon that died in the middle of attempt 2.
	if _, err := l.setCompensation(sb, a.ID, Compensation{State: CompRunning, Rollback: "ck", Batch: "b1", Attempts: 2}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l = open(t, dir)
	open := l.OpenCompensations(sb)
	if len(open) != 1 || open[0].ID != a.ID || open[0].Compensation.State != CompRunning {
		t.Fatalf("open compensations after a restart: %+v", open)
	}
	var at []time.Time
	fail := func(_ context.Context, r Record, attempt int) error {
		at = append(at, time.Now())
		if attempt < 4 {
			return errors.New("not yet")
		}
		return nil
	}
	out, err := l.Run(context.Background(), sb, "b1", RunOptions{Attempts: 2, Backoff: 20 * time.Millisecond}, fail)
	if err != nil {
		t.Fatal(err)
	}
	// Limit 2, but attempt 2 was interrupted: attempt 3 is its re-send,
	// and it failing ends the compensation.
	if len(out) != 1 || out[0].State != CompFailed || out[0].Attempts != 3 || len(at) != 1 {
		t.Fatalf("outcome %+v after %d attempts", out, len(at))
	}
	// A fresh one: limit 4, fails three times, backing off 20, 40, 80 ms.
	b := undoable(t, l, sb, "/b", nil)
	if err := l.Plan(sb, "ck", "b2", []string{b.ID}); err != nil {
		t.Fatal(err)
	}
	at = nil
	out, err = l.Run(context.Background(), sb, "b2", RunOptions{Attempts: 4, Backoff: 20 * time.Millisecond}, fail)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].State != CompDone || out[0].Attempts != 4 || len(at) != 4 {
		t.Fatalf("outcome %+v after %d attempts", out, len(at))
	}
	for i, min := range []time.Duration{20, 40, 80} {
		if d := at[i+1].Sub(at[i]); d < min*time.Millisecond {
			t.Errorf("backoff before attempt %d: %v, want at least %v", i+2, d, min*time.Millisecond)
		}
	}
}

func TestSetCompensator(t *testing.T) {
	l := open(t, t.TempDir())
	const sb = "sb"
	r := effect(t, l, sb, post("/pay", `{}`), 200)
	if _, err := l.SetCompensator(sb, r.ID, Compensator{Method: "POST"}); err == nil {
		t.Fatal("a compensator without a URL was accepted")
	}
	if _, err := l.SetCompensator(sb, r.ID, Compensator{Method: "POST", URL: "u", Sandbox: "h", Command: []string{"x"}}); err == nil {
		t.Fatal("a compensator of both kinds was accepted")
	}
	got, err := l.SetCompensator(sb, r.ID, Compensator{Sandbox: "helper", Command: []string{"refund", "1"}})
	if err != nil || got.Compensator == nil || got.Compensator.Sandbox != "helper" {
		t.Fatalf("%+v %v", got, err)
	}
	l.Close()
	l2 := open(t, l.dir)
	if g, _ := l2.Get(sb, r.ID); g.Compensator == nil || !slices.Equal(g.Compensator.Command, []string{"refund", "1"}) {
		t.Fatalf("after reopen: %+v", g.Compensator)
	}
}
