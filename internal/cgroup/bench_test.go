package cgroup

import (
	"context"
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
