package cgroup

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/testutil"
)

// BenchmarkFreezeThaw times one freeze (until the kernel reports the group
// frozen) plus one thaw, for the cgroup2 freezer and the v1 freezer side by
// side, with a sleeping and with a CPU-bound process in the group.
// freeze-µs/op is the freeze alone, max-freeze-µs its worst case, and
// thaw-µs/op the thaw alone.
//
//	go test -run XXX -bench FreezeThaw -benchtime 50x ./internal/cgroup/
func BenchmarkFreezeThaw(b *testing.B) {
	testutil.RequireRoot(b)
	l := backends(b)[0].l
	workloads := []struct{ name, script string }{
		{"sleeping", "exec sleep 1000"},
		{"busy", "while :; do :; done"},
	}
	for _, w := range workloads {
		for _, method := range []string{"cgroup2", "v1-freezer", "Freeze"} {
			b.Run(w.name+"/"+method, func(b *testing.B) {
				c := newTest(b, l, Resources{})
				freeze, thaw := c.freezeV2, c.thawV2
				switch method {
				case "v1-freezer":
					freeze, thaw = c.freezeV1, c.thawV1
				case "Freeze":
					freeze, thaw = c.Freeze, c.Thaw
				}
				if method == "cgroup2" && !c.hasFreeze2 || method == "v1-freezer" && c.freezer == "" {
					b.Skipf("no %s freezer here", method)
				}
				startIn(b, c, w.script)
				for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
					if pids, _ := c.Pids(); len(pids) > 0 {
						break
					}
					if time.Now().After(deadline) {
						b.Fatal("process never entered the cgroup")
					}
				}
				ctx := context.Background()
				var freezes []time.Duration
				var thawed time.Duration
				for b.Loop() {
					begin := time.Now()
					if err := freeze(ctx); err != nil {
						b.Fatal(err)
					}
					frozen := time.Now()
					freezes = append(freezes, frozen.Sub(begin))
					if err := thaw(); err != nil {
						b.Fatal(err)
					}
					thawed += time.Since(frozen)
				}
				var sum time.Duration
				for _, d := range freezes {
					sum += d
				}
				n := float64(len(freezes))
				b.ReportMetric(float64(sum.Microseconds())/n, "freeze-µs/op")
				b.ReportMetric(float64(slices.Max(freezes).Microseconds()), "max-freeze-µs")
				b.ReportMetric(float64(thawed.Microseconds())/n, "thaw-µs/op")
			})
		}
	}
}

// BenchmarkMoveVsLimits compares what a hot rollback would pay to move a
// standby's tree from a sibling cgroup into the sandbox's (every task
// through every hierarchy) with what it pays to change the sandbox's
// limits instead (one memory and one pids write), for trees of 1 and 36
// tasks.
//
//	go test -run XXX -bench MoveVsLimits -benchtime 50x ./internal/cgroup/
func BenchmarkMoveVsLimits(b *testing.B) {
	testutil.RequireRoot(b)
	l := backends(b)[0].l
	for _, n := range []int{1, 36} {
		b.Run(fmt.Sprintf("move-%d-tasks", n), func(b *testing.B) {
			src := newTest(b, l, Resources{})
			dst, err := newIn(l, testName(b)+"-dst", Resources{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = dst.Destroy(context.Background()) })
			var pids []int
			for i := 0; i < n; i++ {
				pids = append(pids, startIn(b, src, "exec sleep 1000").cmd.Process.Pid)
			}
			from, to := src, dst
			for b.Loop() {
				for _, pid := range pids {
					if err := to.Add(pid); err != nil {
						b.Fatal(err)
					}
				}
				from, to = to, from
			}
			_ = from
		})
	}
	b.Run("limits", func(b *testing.B) {
		c := newTest(b, l, Resources{MemoryMax: 256 << 20, PidsMax: 48})
		hi := true
		for b.Loop() {
			res := Resources{MemoryMax: 256 << 20, PidsMax: 48}
			if hi {
				res = Resources{MemoryMax: 512 << 20, PidsMax: 96}
			}
			if err := c.SetLimits(res); err != nil {
				b.Fatal(err)
			}
			hi = !hi
		}
	})
}

// BenchmarkEnforce is the daemon's limit check at every checkpoint and
// restore when nothing changed.
func BenchmarkEnforce(b *testing.B) {
	testutil.RequireRoot(b)
	l, err := hostLayout()
	if err != nil {
		b.Skip(err)
	}
	res := Resources{MemoryMax: 256 << 20, PidsMax: 48, CPUMillis: 1000}
	c := newTest(b, l, res)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if d, err := c.Enforce(res); err != nil || len(d) != 0 {
			b.Fatal(d, err)
		}
	}
}
