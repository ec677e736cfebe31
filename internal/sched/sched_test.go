package sched

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/prometheus/client_golang/prometheus"
)

// long bounds waits for things that must happen; short is how long a
// test watches for something that must not.
const (
	long  = 10 * time.Second
	short = 150 * time.Millisecond
)

func newSched(t testing.TB, cfg Config) *Scheduler {
	t.Helper()
	s := New(cfg)
	t.Cleanup(func() { s.Close() })
	return s
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), long)
	t.Cleanup(cancel)
	return ctx
}

func wait(t testing.TB, j *Job) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), long)
	defer cancel()
	err := j.Wait(ctx)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		t.Fatalf("job %s (%s/%s) did not end", j.Name(), j.Sandbox(), j.Class())
	}
	return err
}

func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(long):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func never[T any](t testing.TB, ch <-chan T, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s happened, and should not have", what)
	case <-time.After(short):
	}
}

// blocker submits a job that signals when it starts and runs until
// release is closed.
func blocker(t testing.TB, s *Scheduler, sandbox string, class Class) (started <-chan struct{}, release chan struct{}, j *Job) {
	t.Helper()
	st, rel := make(chan struct{}), make(chan struct{})
	j, err := s.Submit(ctxT(t), sandbox, class, "blocker", func(ctx context.Context, _ *Task) error {
		close(st)
		select {
		case <-rel:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return st, rel, j
}

// recorder collects the names of jobs in the order they start.
type recorder struct {
	mu    sync.Mutex
	order []string
}

func (r *recorder) job(name string) func(context.Context, *Task) error {
	return func(context.Context, *Task) error {
		r.mu.Lock()
		r.order = append(r.order, name)
		r.mu.Unlock()
		return nil
	}
}

func (r *recorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.order...)
}

func TestDefaults(t *testing.T) {
	for _, tc := range []struct{ ncpu, want int }{{1, 1}, {2, 1}, {3, 1}, {4, 2}, {16, 8}} {
		if got := defaultWorkers(tc.ncpu); got != tc.want {
			t.Errorf("defaultWorkers(%d) = %d, want %d", tc.ncpu, got, tc.want)
		}
	}
	c := Config{Workers: 4}.withDefaults()
	if c.MaxQueuedPerSandbox != 8 || c.MaxQueued != 256 || c.BytesPerSec != 0 || c.Burst != 0 {
		t.Errorf("defaults: %+v", c)
	}
	if c.ClassWorkers != [NumClasses]int{0, 4, 2, 1} {
		t.Errorf("class workers: %v", c.ClassWorkers)
	}
	if c := (Config{BytesPerSec: 8 << 20}).withDefaults(); c.Burst != 2<<20 {
		t.Errorf("burst: %d", c.Burst)
	}
	if c := (Config{Workers: 1, ClassWorkers: [NumClasses]int{Persist: 5}}).withDefaults(); c.ClassWorkers[Persist] != 1 {
		t.Errorf("class cap not clamped to Workers: %v", c.ClassWorkers)
	}
}

func TestPriorityOrder(t *testing.T) {
	s := newSched(t, Config{Workers: 1})
	started, release, _ := blocker(t, s, "blk", GC)
	recv(t, started, "blocker start")
	var r recorder
	var jobs []*Job
	// Lowest class first, so that submission order cannot explain the
	// result.
	for _, c := range []Class{GC, Standby, Persist} {
		for _, sb := range []string{"a", "b", "c"} {
			j, err := s.Submit(ctxT(t), sb, c, c.String()+"-"+sb, r.job(c.String()))
			if err != nil {
				t.Fatal(err)
			}
			jobs = append(jobs, j)
		}
	}
	if st := s.Stats(); st.Classes[Persist].Queued != 3 || st.Classes[Standby].Queued != 3 || st.Classes[GC].Queued != 3 || st.Classes[GC].Running != 1 {
		t.Fatalf("stats before release: %+v", st.Classes)
	}
	close(release)
	for _, j := range jobs {
		if err := wait(t, j); err != nil {
			t.Fatal(err)
		}
	}
	got := strings.Join(r.get(), " ")
	want := "persist persist persist standby standby standby gc gc gc"
	if got != want {
		t.Fatalf("dispatch order:\n got %s\nwant %s", got, want)
	}
}

func TestRoundRobin(t *testing.T) {
	s := newSched(t, Config{Workers: 1, MaxQueuedPerSandbox: 32})
	started, release, _ := blocker(t, s, "blk", Persist)
	recv(t, started, "blocker start")
	var r recorder
	var jobs []*Job
	submit := func(sb string, n int) {
		for i := range n {
			j, err := s.Submit(ctxT(t), sb, Persist, "", r.job(fmt.Sprintf("%s%d", sb, i)))
			if err != nil {
				t.Fatal(err)
			}
			jobs = append(jobs, j)
		}
	}
	submit("A", 20)
	submit("B", 2)
	close(release)
	for _, j := range jobs {
		if err := wait(t, j); err != nil {
			t.Fatal(err)
		}
	}
	order := r.get()
	pos := map[string]int{}
	for i, name := range order {
		pos[name] = i
	}
	// A was queued first, so A0 goes first; then they alternate.
	if pos["B0"] > 2 || pos["B1"] > 4 {
		t.Fatalf("B starved: order %v", order)
	}
	for i := 1; i < 20; i++ {
		if pos[fmt.Sprintf("A%d", i)] < pos[fmt.Sprintf("A%d", i-1)] {
			t.Fatalf("A out of order: %v", order)
		}
	}
}

func TestFIFOOneAtATime(t *testing.T) {
	s := newSched(t, Config{Workers: 4, ClassWorkers: [NumClasses]int{Persist: 4}, MaxQueuedPerSandbox: 16})
	const n = 12
	var (
		mu      sync.Mutex
		order   = map[string][]int{}
		active  = map[string]int{}
		maxLane int
		total   int
		maxAll  int
	)
	var jobs []*Job
	for i := range n {
		for _, sb := range []string{"a", "b", "c"} {
			j, err := s.Submit(ctxT(t), sb, Persist, "", func(ctx context.Context, _ *Task) error {
				mu.Lock()
				active[sb]++
				total++
				maxLane = max(maxLane, active[sb])
				maxAll = max(maxAll, total)
				order[sb] = append(order[sb], i)
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				mu.Lock()
				active[sb]--
				total--
				mu.Unlock()
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			jobs = append(jobs, j)
		}
	}
	for _, j := range jobs {
		if err := wait(t, j); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if maxLane != 1 {
		t.Errorf("jobs of one (sandbox, class) ran concurrently: %d at once", maxLane)
	}
	if maxAll < 2 {
		t.Errorf("lanes of different sandboxes never ran concurrently (max %d)", maxAll)
	}
	for sb, o := range order {
		for i, v := range o {
			if v != i {
				t.Fatalf("sandbox %s ran out of order: %v", sb, o)
			}
		}
	}
}

func TestBackPressure(t *testing.T) {
	s := newSched(t, Config{Workers: 1, MaxQueuedPerSandbox: 2, MaxQueued: 3})
	started, release, _ := blocker(t, s, "a", Persist)
	recv(t, started, "blocker start")
	noop := func(context.Context, *Task) error { return nil }
	for range 2 {
		if _, err := s.Submit(ctxT(t), "a", Persist, "q", noop); err != nil {
			t.Fatal(err)
		}
	}
	// The (a, persist) lane is full; another class of a is not.
	if _, err := s.TrySubmit("a", Persist, "full", noop); !errors.Is(err, ErrQueueFull) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("TrySubmit into a full lane: %v", err)
	}
	if _, err := s.TrySubmit("a", GC, "gc", noop); err != nil {
		t.Fatalf("TrySubmit into another lane: %v", err)
	}
	// 3 queued: the host queue is full too.
	if _, err := s.TrySubmit("b", Persist, "host-full", noop); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("TrySubmit into a full host queue: %v", err)
	}

	// A canceled ctx unblocks Submit.
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := s.Submit(ctx, "b", Persist, "canceled", noop)
		errc <- err
	}()
	never(t, errc, "Submit returning while the queue is full")
	cancel()
	if err := recv(t, errc, "canceled Submit"); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled Submit: %v", err)
	}

	// A blocked Submit goes through once a queued job leaves the queue.
	type res struct {
		j   *Job
		err error
	}
	resc := make(chan res, 1)
	go func() {
		j, err := s.Submit(ctxT(t), "a", Persist, "late", noop)
		resc <- res{j, err}
	}()
	never(t, resc, "Submit returning while the queue is full")
	close(release)
	r := recv(t, resc, "blocked Submit")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := wait(t, r.j); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitSandbox(ctxT(t), "a"); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Classes[Persist].Done != 4 || st.Classes[GC].Done != 1 || st.Classes[Persist].Queued != 0 {
		t.Fatalf("stats: %+v", st.Classes)
	}
}

// charger is a job that charges in a loop, reporting each Charge's
// return, until stopped.
func charger(t testing.TB, s *Scheduler, sandbox string, class Class) (charged <-chan struct{}, stop chan struct{}, j *Job) {
	t.Helper()
	ch, st := make(chan struct{}, 1000), make(chan struct{})
	j, err := s.Submit(ctxT(t), sandbox, class, "charger", func(ctx context.Context, task *Task) error {
		for {
			select {
			case <-st:
				return nil
			default:
			}
			if err := task.Charge(ctx, 1); err != nil {
				return err
			}
			select {
			case ch <- struct{}{}:
			default:
			}
			time.Sleep(time.Millisecond)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return ch, st, j
}

func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func TestForegroundPauses(t *testing.T) {
	s := newSched(t, Config{Workers: 2})
	charged, stop, cj := charger(t, s, "x", Persist)
	recv(t, charged, "charger running")

	release := s.Foreground("y")
	if st := s.Stats(); st.Foreground != 1 {
		t.Fatalf("foreground holders: %d", st.Foreground)
	}
	// At most one Charge was past the pause check.
	time.Sleep(20 * time.Millisecond)
	drain(charged)
	never(t, charged, "Charge returning during foreground")

	// Nothing new is dispatched, though a worker is free.
	started, rel, bj := blocker(t, s, "z", Persist)
	never(t, started, "dispatch during foreground")

	release()
	recv(t, started, "dispatch after foreground")
	recv(t, charged, "Charge after foreground")
	close(rel)
	close(stop)
	for _, j := range []*Job{cj, bj} {
		if err := wait(t, j); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	if st.Foreground != 0 || st.PausedTime < short/2 {
		t.Fatalf("stats: foreground %d, paused %v", st.Foreground, st.PausedTime)
	}
}

func TestForegroundInheritance(t *testing.T) {
	s := newSched(t, Config{Workers: 1})
	charged, stop, cj := charger(t, s, "x", Persist)
	recv(t, charged, "charger running")

	// The sandbox's own background work goes on...
	release := s.Foreground("x")
	drain(charged)
	recv(t, charged, "own Charge during own foreground")
	// ...and its queued jobs start at once, past the worker limit,
	// while other sandboxes' do not.
	started, rel, bj := blocker(t, s, "x", GC)
	other, orel, oj := blocker(t, s, "o", Persist)
	recv(t, started, "own job during own foreground")
	never(t, other, "other sandbox's job during foreground")

	// A second holder for another sandbox pauses x's work no more.
	release2 := s.Foreground("y")
	drain(charged)
	recv(t, charged, "own Charge with another holder")
	release()
	// Now only y holds: x is paused.
	time.Sleep(20 * time.Millisecond)
	drain(charged)
	never(t, charged, "Charge of x while only y holds foreground")
	release2()
	recv(t, charged, "Charge after every release")

	close(rel)
	close(stop)
	recv(t, other, "other sandbox's job after foreground")
	close(orel)
	for _, j := range []*Job{cj, bj, oj} {
		if err := wait(t, j); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRollbackJobs(t *testing.T) {
	s := newSched(t, Config{Workers: 1, MaxQueued: 2})
	started, rel, bj := blocker(t, s, "a", Persist)
	recv(t, started, "blocker start")
	f1s, f1r, f1 := blocker(t, s, "f1", GC)
	f2s, f2r, f2 := blocker(t, s, "f2", GC)
	// A Rollback job is neither queued behind background work nor held
	// back by the full host queue.
	if _, err := s.TrySubmit("f3", GC, "full", func(context.Context, *Task) error { return nil }); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("host queue not full: %v", err)
	}
	rbStarted, rbRel, rj := blocker(t, s, "b", Rollback)
	recv(t, rbStarted, "rollback job despite busy worker")
	if st := s.Stats(); st.Foreground != 1 || st.Classes[Rollback].Running != 1 {
		t.Fatalf("stats: %+v", st)
	}
	// While it runs it is foreground: the freed worker takes nothing.
	close(rel)
	if err := wait(t, bj); err != nil {
		t.Fatal(err)
	}
	never(t, f1s, "dispatch during a rollback job")
	close(rbRel)
	if err := wait(t, rj); err != nil {
		t.Fatal(err)
	}
	recv(t, f1s, "dispatch after the rollback job")
	close(f1r)
	recv(t, f2s, "dispatch after the rollback job")
	close(f2r)
	for _, j := range []*Job{f1, f2} {
		if err := wait(t, j); err != nil {
			t.Fatal(err)
		}
	}
	if st := s.Stats(); st.Foreground != 0 || st.Classes[Rollback].Done != 1 || st.Classes[GC].Done != 2 {
		t.Fatalf("stats: %+v", st)
	}
}

// A Charge waiting for tokens or for the foreground, under a ctx that is
// not the job's, still ends when the job is canceled.
func TestCancelUnblocksCharge(t *testing.T) {
	limited := newSched(t, Config{BytesPerSec: 1 << 20, Burst: 1 << 10})
	unlimited := newSched(t, Config{})
	in := make(chan struct{}, 1)
	submit := func(s *Scheduler, n int64, gate chan struct{}) *Job {
		j, err := s.Submit(ctxT(t), "a", Persist, "charge", func(_ context.Context, task *Task) error {
			in <- struct{}{}
			<-gate
			return task.Charge(context.Background(), n)
		})
		if err != nil {
			t.Fatal(err)
		}
		recv(t, in, "job start")
		return j
	}
	open := make(chan struct{})
	close(open)
	throttled := submit(limited, 1<<30, open)
	gate := make(chan struct{})
	paused := submit(unlimited, 1, gate)
	release := unlimited.Foreground("")
	defer release()
	close(gate)
	// Until the job is waiting in Charge.
	for {
		unlimited.mu.Lock()
		waiting := unlimited.fgWake != nil
		unlimited.mu.Unlock()
		if waiting {
			break
		}
		time.Sleep(time.Millisecond)
	}
	never(t, throttled.Done(), "throttled job ending")
	limited.CancelSandbox("a")
	unlimited.CancelSandbox("a")
	for _, j := range []*Job{throttled, paused} {
		if err := wait(t, j); !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled charging job: %v", err)
		}
	}
}

func TestChargeRate(t *testing.T) {
	const rate, burst, total, chunk = 8 << 20, 1 << 20, 4 << 20, 64 << 10
	s := newSched(t, Config{Workers: 2, BytesPerSec: rate, Burst: burst})
	// Two jobs share the budget.
	var jobs []*Job
	start := time.Now()
	for _, sb := range []string{"a", "b"} {
		j, err := s.Submit(ctxT(t), sb, Persist, "write", func(ctx context.Context, task *Task) error {
			for n := 0; n < total/2; n += chunk {
				if err := task.Charge(ctx, chunk); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, j)
	}
	for _, j := range jobs {
		if err := wait(t, j); err != nil {
			t.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	// (4 MiB - 1 MiB burst) / 8 MiB/s = 375 ms.
	if elapsed < 300*time.Millisecond || elapsed > 2*time.Second {
		t.Fatalf("4 MiB at 8 MiB/s with a 1 MiB burst took %v, want ~375ms", elapsed)
	}
	st := s.Stats()
	if st.Bytes != total || st.Classes[Persist].Bytes != total {
		t.Fatalf("bytes charged: %d", st.Bytes)
	}
	if st.ThrottledTime < 200*time.Millisecond {
		t.Fatalf("throttled time: %v", st.ThrottledTime)
	}

	// Unlimited: no wait.
	u := newSched(t, Config{})
	start = time.Now()
	j, err := u.Submit(ctxT(t), "a", Persist, "write", func(ctx context.Context, task *Task) error {
		return task.Charge(ctx, 1<<40)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, j); err != nil || time.Since(start) > time.Second {
		t.Fatalf("unlimited charge: %v after %v", err, time.Since(start))
	}
}

func TestChargeCtx(t *testing.T) {
	s := newSched(t, Config{Workers: 1, BytesPerSec: 1 << 20, Burst: 1 << 10})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	j, err := s.Submit(ctxT(t), "a", Persist, "slow", func(_ context.Context, task *Task) error {
		err := task.Charge(ctx, 1<<30) // ~17 minutes
		errc <- err
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	never(t, errc, "charge of 1 GiB at 1 MiB/s returning")
	cancel()
	if err := recv(t, errc, "Charge after cancel"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Charge: %v", err)
	}
	if err := wait(t, j); !errors.Is(err, context.Canceled) || errors.Is(err, ErrCanceled) {
		t.Fatalf("job: %v", err) // canceled by its own code, not by the scheduler
	}
	if st := s.Stats(); st.Classes[Persist].Failed != 1 {
		t.Fatalf("stats: %+v", st.Classes[Persist])
	}
	// The refund leaves the bucket about where it was: a small charge
	// does not wait for the abandoned one's debt.
	start := time.Now()
	j, err = s.Submit(ctxT(t), "a", Persist, "small", func(ctx context.Context, task *Task) error {
		return task.Charge(ctx, 1<<10)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, j); err != nil || time.Since(start) > 2*time.Second {
		t.Fatalf("small charge after refund: %v after %v", err, time.Since(start))
	}
}

func TestCancelSandbox(t *testing.T) {
	s := newSched(t, Config{Workers: 1})
	started, _, running := blocker(t, s, "a", Persist)
	recv(t, started, "blocker start")
	var r recorder
	var queuedA, queuedB []*Job
	for i := range 3 {
		j, err := s.Submit(ctxT(t), "a", Persist, "", r.job(fmt.Sprint("a", i)))
		if err != nil {
			t.Fatal(err)
		}
		queuedA = append(queuedA, j)
		j, err = s.Submit(ctxT(t), "b", Persist, "", r.job(fmt.Sprint("b", i)))
		if err != nil {
			t.Fatal(err)
		}
		queuedB = append(queuedB, j)
	}
	j, err := s.Submit(ctxT(t), "a", GC, "", r.job("agc"))
	if err != nil {
		t.Fatal(err)
	}
	queuedA = append(queuedA, j)

	s.CancelSandbox("a")
	for _, j := range queuedA {
		if err := wait(t, j); !errors.Is(err, ErrCanceled) {
			t.Fatalf("queued job of canceled sandbox: %v", err)
		}
	}
	if err := wait(t, running); !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("running job of canceled sandbox: %v", err)
	}
	for _, j := range queuedB {
		if err := wait(t, j); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.WaitSandbox(ctxT(t), "a"); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.get(), " "); got != "b0 b1 b2" {
		t.Fatalf("ran: %s", got)
	}
	st := s.Stats()
	if st.Classes[Persist].Canceled != 4 || st.Classes[GC].Canceled != 1 || st.Classes[Persist].Done != 3 {
		t.Fatalf("stats: %+v", st.Classes)
	}
	// The sandbox can submit again.
	j, err = s.Submit(ctxT(t), "a", Persist, "", r.job("again"))
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, j); err != nil {
		t.Fatal(err)
	}
	// A canceled queued Rollback job gives back its foreground.
	s2 := newSched(t, Config{})
	rs, _, _ := blocker(t, s2, "r", Rollback)
	recv(t, rs, "rollback job start")
	rq, err := s2.Submit(ctxT(t), "r", Rollback, "second", r.job("r"))
	if err != nil {
		t.Fatal(err)
	}
	if st := s2.Stats(); st.Foreground != 2 {
		t.Fatalf("foreground with two rollback jobs: %d", st.Foreground)
	}
	s2.CancelSandbox("r")
	if err := wait(t, rq); !errors.Is(err, ErrCanceled) {
		t.Fatal(err)
	}
	if err := s2.WaitSandbox(ctxT(t), "r"); err != nil {
		t.Fatal(err)
	}
	if st := s2.Stats(); st.Foreground != 0 {
		t.Fatalf("foreground after cancel: %d", st.Foreground)
	}
}

func TestCloseWaits(t *testing.T) {
	s := New(Config{Workers: 1})
	var cleaned atomic.Bool
	started := make(chan struct{})
	running, err := s.Submit(ctxT(t), "a", Persist, "slow-cleanup", func(ctx context.Context, _ *Task) error {
		close(started)
		<-ctx.Done()
		time.Sleep(100 * time.Millisecond) // cleanup after cancel
		cleaned.Store(true)
		return ctx.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, started, "job start")
	queued, err := s.Submit(ctxT(t), "b", Persist, "queued", func(context.Context, *Task) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	// A Submit blocked on a full queue gets ErrClosed.
	for range 7 {
		if _, err := s.Submit(ctxT(t), "b", Persist, "fill", func(context.Context, *Task) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	blocked := make(chan error, 1)
	go func() {
		_, err := s.Submit(ctxT(t), "b", Persist, "blocked", func(context.Context, *Task) error { return nil })
		blocked <- err
	}()
	never(t, blocked, "Submit into a full queue returning")

	s.Close()
	if !cleaned.Load() {
		t.Fatal("Close returned before the running job did")
	}
	if err := running.Err(); !errors.Is(err, ErrCanceled) {
		t.Fatalf("running job: %v", err)
	}
	if err := queued.Err(); !errors.Is(err, ErrCanceled) {
		t.Fatalf("queued job: %v", err)
	}
	if err := recv(t, blocked, "blocked Submit"); !errors.Is(err, ErrClosed) {
		t.Fatalf("blocked Submit: %v", err)
	}
	if _, err := s.Submit(ctxT(t), "a", Persist, "late", func(context.Context, *Task) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
	s.Close() // idempotent
}

func TestSubmitFromJob(t *testing.T) {
	// One worker, room for one queued job: a job that submits follow-up
	// work while the queue is full must not deadlock.
	s := newSched(t, Config{Workers: 1, MaxQueuedPerSandbox: 1, MaxQueued: 1})
	var r recorder
	inner := make(chan *Job, 1)
	outer, err := s.Submit(ctxT(t), "a", Persist, "outer", func(ctx context.Context, _ *Task) error {
		// Fill the host queue.
		if _, err := s.TrySubmit("b", GC, "fill", r.job("fill")); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
		if _, err := s.TrySubmit("a", Standby, "try", r.job("try")); !errors.Is(err, ErrQueueFull) {
			return fmt.Errorf("TrySubmit from a job into a full queue: %v", err)
		}
		// Blocking here would deadlock: the only worker is this job.
		j, err := s.Submit(ctx, "a", Standby, "standby", r.job("standby"))
		if err != nil {
			return err
		}
		inner <- j
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, outer); err != nil {
		t.Fatal(err)
	}
	j := recv(t, inner, "nested job")
	if err := wait(t, j); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitSandbox(ctxT(t), "b"); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.get(), " "); got != "standby fill" {
		t.Fatalf("ran: %s", got)
	}
}

func TestMetrics(t *testing.T) {
	s := newSched(t, Config{Workers: 1})
	reg := prometheus.NewRegistry()
	if err := s.Register(reg); err != nil {
		t.Fatal(err)
	}
	j, err := s.Submit(ctxT(t), "a", Persist, "m", func(ctx context.Context, task *Task) error {
		return task.Charge(ctx, 1000)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, j); err != nil {
		t.Fatal(err)
	}
	j, _ = s.Submit(ctxT(t), "a", GC, "m", func(context.Context, *Task) error { return errors.New("boom") })
	if err := wait(t, j); err == nil {
		t.Fatal("want error")
	}
	release := s.Foreground("a")
	defer release()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			switch {
			case m.Gauge != nil:
				got[key] = m.GetGauge().GetValue()
			case m.Counter != nil:
				got[key] = m.GetCounter().GetValue()
			case m.Histogram != nil:
				got[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	for key, want := range map[string]float64{
		"molt_sched_queue_depth,class=persist":             0,
		"molt_sched_running,class=gc":                      0,
		"molt_sched_jobs_total,class=persist,result=done":  1,
		"molt_sched_jobs_total,class=gc,result=failed":     1,
		"molt_sched_jobs_total,class=gc,result=canceled":   0,
		"molt_sched_wait_seconds,class=persist":            1,
		"molt_sched_bytes_total":                           1000,
		"molt_sched_throttled_seconds_total":               0,
		"molt_sched_paused_seconds_total":                  0,
		"molt_sched_foreground":                            1,
		"molt_sched_wait_seconds,class=rollback":           0,
		"molt_sched_queue_depth,class=rollback":            0,
		"molt_sched_jobs_total,class=standby,result=done":  0,
		"molt_sched_jobs_total,class=rollback,result=done": 0,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", key, v, ok, want)
		}
	}
}

func TestPanicBecomesError(t *testing.T) {
	s := newSched(t, Config{Workers: 1})
	j, err := s.Submit(ctxT(t), "a", Persist, "bad", func(context.Context, *Task) error { panic("oops") })
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, j); err == nil || !strings.Contains(err.Error(), "oops") {
		t.Fatalf("panicking job: %v", err)
	}
	// The scheduler goes on.
	j, err = s.Submit(ctxT(t), "a", Persist, "good", func(context.Context, *Task) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, j); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkForeground(b *testing.B) {
	s := New(Config{})
	defer s.Close()
	b.ReportAllocs()
	for b.Loop() {
		release := s.Foreground("sandbox")
		release()
	}
}

func BenchmarkForegroundParallel(b *testing.B) {
	s := New(Config{})
	defer s.Close()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			release := s.Foreground("sandbox")
			release()
		}
	})
}
