package core

import (
	"context"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/molt-sh/molt/api/v1"
)

// BenchmarkMigratePrecopy migrates a sandbox with no full checkpoint,
// whose Python process holds random bytes (MOLT_BENCH_SIZES, default
// "256M,1G"), between two daemons sharing a bucket of the tests' S3
// server: with its memory sent ahead while it runs (precopy.go) and
// without (the whole memory uploaded in the frozen window, as before),
// the order alternating, each migration of a sandbox of its own (fresh
// bytes: nothing in the store). It reports the downtime (final
// checkpoint to the target running) and the pre-copy's time.
//
//	MOLT_BENCH_SIZES=256M,1G go test -run XXX -bench MigratePrecopy -benchtime 2x -timeout 40m ./internal/core
func BenchmarkMigratePrecopy(b *testing.B) {
	benchSizes(b, "256M,1G", benchMigratePrecopy)
}

func benchMigratePrecopy(b *testing.B, size int64) {
	m1, m2, _ := twoHosts(b, size)
	ctx := context.Background()
	var down, upload, pre [2]time.Duration // without, with
	var n [2]int
	b.ResetTimer()
	for i := range b.N {
		for _, with := range [][]bool{{false, true}, {true, false}}[i%2] {
			b.StopTimer()
			sb, err := m1.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{MemoryBytes: size + 1<<30}})
			if err != nil {
				b.Fatal(err)
			}
			startRandomHeap(b, m1, sb.ID, size)
			// The disk settled: the fill's and the sandbox's writes
			// written back before the migration is timed.
			unix.Sync()
			time.Sleep(2 * time.Second)
			b.StartTimer()
			m1.opts.noPrecopy = !with
			mg, err := m1.Migrate(ctx, sb.ID, managerTarget{m2})
			m1.opts.noPrecopy = false
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			j := 0
			if with {
				j = 1
			}
			down[j] += time.Duration(mg.DowntimeMS * float64(time.Millisecond))
			upload[j] += time.Duration(mg.UploadMS * float64(time.Millisecond))
			pre[j] += time.Duration(mg.PrecopyMS * float64(time.Millisecond))
			n[j]++
			b.Logf("%d MiB: pre-copy %v: sent %d MiB ahead in %.0f ms; down %.0f ms (upload %.0f ms, target's resume %.0f ms)",
				size>>20, with, mg.PrecopySentBytes>>20, mg.PrecopyMS, mg.DowntimeMS, mg.UploadMS, mg.ResumeMS)
			if err := m2.Remove(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	avg := func(d time.Duration, k int) float64 { return float64(d.Milliseconds()) / float64(max(k, 1)) }
	b.ReportMetric(avg(down[0], n[0]), "down-ms/without")
	b.ReportMetric(avg(down[1], n[1]), "down-ms/with")
	b.ReportMetric(avg(upload[0], n[0]), "upload-ms/without")
	b.ReportMetric(avg(upload[1], n[1]), "upload-ms/with")
	b.ReportMetric(avg(pre[1], n[1]), "precopy-ms")
	b.ReportMetric(avg(down[0], n[0])/avg(down[1], n[1]), "down-without/with")
}
