package hot

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type want struct {
	id    string
	bytes int64
}

func size(w want) (string, int64) { return w.id, w.bytes }

func ids(ws []want) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.id)
	}
	return out
}

// Admission keeps the wanted order, skips what does not fit (a later,
// smaller one may still fit) and says why the first one was left out.
func TestAdmit(t *testing.T) {
	wanted := []want{{"head", 60}, {"keep1", 50}, {"keep2", 30}}
	cases := []struct {
		name              string
		own, host, others int64
		admitted          []string
		refused           string
	}{
		{"all fit", 0, 1000, 0, []string{"head", "keep1", "keep2"}, ""},
		{"own budget skips the middle", 100, 1000, 0, []string{"head", "keep2"}, "standby of keep1 needs 50 bytes; the sandbox's standbys before it take 60 of its budget of 100"},
		{"host budget with others", 0, 200, 100, []string{"head", "keep2"}, "standby of keep1 needs 50 bytes; 160 of the host's budget of 200 are taken"},
		{"none allowed", -1, 1000, 0, nil, "sandbox sb allows no standbys"},
		{"nothing fits", 10, 1000, 0, nil, "standby of head needs 60 bytes"},
		{"exact fit", 140, 140, 0, []string{"head", "keep1", "keep2"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Admit("sb", c.own, c.host, c.others, wanted, size)
			if !slices.Equal(ids(got), c.admitted) {
				t.Errorf("admitted %v, want %v", ids(got), c.admitted)
			}
			switch {
			case c.refused == "" && err != nil:
				t.Errorf("refused %v", err)
			case c.refused != "" && (err == nil || !strings.HasPrefix(err.Error(), c.refused)):
				t.Errorf("refused %v, want %q", err, c.refused)
			}
		})
	}
	if got, err := Admit("sb", -1, 1000, 0, []want(nil), size); got != nil || err != nil {
		t.Errorf("no wanted, none allowed: %v, %v", got, err)
	}
}

// fakeHead is a sandbox head the waiter follows.
type fakeHead struct {
	mu sync.Mutex
	// +checklocks:mu
	head string
	// +checklocks:mu
	gone bool
}

func (h *fakeHead) get(string) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.head, !h.gone
}

func (h *fakeHead) set(s string) {
	h.mu.Lock()
	h.head = s
	h.mu.Unlock()
}

// A preparation starts once the head has stayed put for the delay, one
// waiter per sandbox, and not while the head keeps moving.
func TestScheduleWaitsForHead(t *testing.T) {
	h := &fakeHead{head: "a"}
	var prepared atomic.Int32
	var at atomic.Value
	p := NewStandbys(StandbyHooks{
		Head: h.get,
		Prepare: func(id string) (<-chan struct{}, bool) {
			prepared.Add(1)
			at.Store(time.Now())
			done := make(chan struct{})
			close(done)
			return done, false
		},
		Release: func(*Standby) {},
	})
	defer p.Close()
	const delay = 50 * time.Millisecond
	start := time.Now()
	p.Schedule("sb", delay)
	p.Schedule("sb", delay) // the same waiter
	// The head moves for a while: no preparation meanwhile.
	for i := 0; i < 6; i++ {
		time.Sleep(delay / 2)
		h.set(string(rune('b' + i)))
	}
	moved := time.Now()
	p.Wait()
	if n := prepared.Load(); n != 1 {
		t.Fatalf("%d preparations, want 1", n)
	}
	if got := at.Load().(time.Time); got.Before(moved) {
		t.Errorf("prepared %v after the start, before the head stopped moving (%v)", got.Sub(start), moved.Sub(start))
	}
	// A sandbox gone meanwhile gets none.
	h.mu.Lock()
	h.gone = true
	h.mu.Unlock()
	p.Schedule("sb", delay)
	p.Wait()
	if n := prepared.Load(); n != 1 {
		t.Fatalf("%d preparations after the sandbox went, want 1", n)
	}
}

// Close ends waiters without preparing, does not wait for a scheduled
// job the scheduler dropped, waits for one run outside it, discards the
// standbys, and a standby made after it is discarded.
func TestStandbysClose(t *testing.T) {
	h := &fakeHead{head: "a"}
	var released []string
	var mu sync.Mutex
	never := make(chan struct{}) // a job the scheduler dropped
	var prepared atomic.Int32
	p := NewStandbys(StandbyHooks{
		Head: h.get,
		Prepare: func(id string) (<-chan struct{}, bool) {
			prepared.Add(1)
			return never, false
		},
		Release: func(s *Standby) {
			mu.Lock()
			released = append(released, s.Sandbox+"/"+s.Checkpoint)
			mu.Unlock()
		},
	})
	p.Put(&Standby{Sandbox: "sb", Checkpoint: "c1", Bytes: 10})
	p.Put(&Standby{Sandbox: "other", Checkpoint: "c2", Bytes: 5})
	if n, b := p.Totals(); n != 2 || b != 15 {
		t.Fatalf("totals %d, %d", n, b)
	}
	if b := p.OthersBytes("sb"); b != 5 {
		t.Fatalf("others %d", b)
	}
	p.Schedule("sb", time.Millisecond)
	for deadline := time.Now().Add(10 * time.Second); prepared.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	p.Schedule("other", time.Hour) // a waiter still waiting
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits for a dropped job or a waiting waiter")
	}
	if n := prepared.Load(); n != 1 {
		t.Errorf("%d preparations, want 1", n)
	}
	p.Put(&Standby{Sandbox: "sb", Checkpoint: "late"})
	slices.Sort(released)
	if want := []string{"other/c2", "sb/c1", "sb/late"}; !slices.Equal(released, want) {
		t.Errorf("released %v, want %v", released, want)
	}
	if n, _ := p.Totals(); n != 0 {
		t.Errorf("%d standbys after Close", n)
	}
	p.Schedule("sb", time.Millisecond) // no waiter after Close
	p.Wait()
}

// A preparation outside the scheduler is waited for at Close.
func TestStandbysCloseAwaits(t *testing.T) {
	h := &fakeHead{head: "a"}
	started := make(chan struct{})
	done := make(chan struct{})
	p := NewStandbys(StandbyHooks{
		Head: h.get,
		Prepare: func(string) (<-chan struct{}, bool) {
			close(started)
			return done, true
		},
		Release: func(*Standby) {},
	})
	p.Schedule("sb", time.Millisecond)
	<-started
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close did not wait for the preparation")
	case <-time.After(100 * time.Millisecond):
	}
	close(done)
	<-closed
}

// Take and DropOf take a standby out once; Drop takes all of a sandbox.
func TestStandbysTable(t *testing.T) {
	var released []string
	p := NewStandbys(StandbyHooks{Head: func(string) (string, bool) { return "", true },
		Prepare: func(string) (<-chan struct{}, bool) { return nil, false },
		Release: func(s *Standby) { released = append(released, s.Checkpoint) }})
	defer p.Close()
	for _, ck := range []string{"b", "a", "c"} {
		p.Put(&Standby{Sandbox: "sb", Checkpoint: ck, Bytes: 1})
	}
	if got := p.Checkpoints("sb"); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("checkpoints %v", got)
	}
	if s := p.Take("sb", "a"); s == nil || p.Take("sb", "a") != nil {
		t.Fatal("take twice")
	}
	p.DropOf("sb", "b", false)
	p.DropOf("sb", "b", false)
	if p.Bytes("sb") != 1 || p.Get("sb", "c") == nil {
		t.Fatalf("left: %v", p.Checkpoints("sb"))
	}
	p.Drop("sb", false)
	if !slices.Equal(released, []string{"b", "c"}) || len(p.Checkpoints("sb")) != 0 {
		t.Fatalf("released %v, left %v", released, p.Checkpoints("sb"))
	}
}
