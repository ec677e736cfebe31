package core

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/objstore"
	"github.com/molt-sh/molt/internal/objstore/s3test"
	"github.com/molt-sh/molt/internal/units"
)

// BenchmarkStoreResume measures hibernating a sandbox to the object store
// and resuming it from there, against resuming it from the local pool
// (the strongest baseline: no store at all), by the memory of its
// Python process (random bytes: nothing to share). Two daemons with
// their own pools share a bucket of the real S3 server of the tests
// (versitygw, on this machine's disk); the sandbox moves from the first
// to the second through the store. Per size, in alternating order:
//
//   - local: Hibernate then Resume on the first daemon, eager (every
//     page read before the tree runs) and lazy (lazylocal.go; also
//     timed until the lazy-pages daemon has every page), in alternating
//     order;
//   - store: Hibernate, Offload (timed: the upload, with the store
//     already holding what earlier checkpoints uploaded), then Resume on
//     the second daemon, and back the same way, twice: eager (timed:
//     fetch and check every page, restore), lazy, lazy, eager (lazy:
//     the resume timed until it returns with the tree running, and
//     until every page is local and checked; nothing else runs before);
//   - migrate: there and back (the target resumes lazily).
//
// Sizes come from MOLT_BENCH_SIZES (default "100M,1G"; "4G" needs a
// host with room for three copies):
//
//	MOLT_BENCH_SIZES=100M,1G,4G go test -run XXX -bench StoreResume -benchtime 1x -timeout 60m ./internal/core
func BenchmarkStoreResume(b *testing.B) {
	benchSizes(b, "100M,1G", benchStoreResume)
}

// benchSizes runs fn for each memory size MOLT_BENCH_SIZES names
// ("100M,1G,4G"), else for those of def.
func benchSizes(b *testing.B, def string, fn func(b *testing.B, size int64)) {
	sizes := os.Getenv("MOLT_BENCH_SIZES")
	if sizes == "" {
		sizes = def
	}
	for _, s := range strings.Split(sizes, ",") {
		var n int64
		var unit string
		if _, err := fmt.Sscanf(s, "%d%s", &n, &unit); err != nil || (unit != "M" && unit != "G") {
			b.Fatalf("MOLT_BENCH_SIZES: %q: want sizes such as 100M or 4G", s)
		}
		if n <<= 20; unit == "G" {
			n <<= 10
		}
		b.Run(s, func(b *testing.B) { fn(b, n) })
	}
}

// startRandomHeap starts in sandbox id a Python process that holds size
// random bytes, and waits until it does. It fills them 16 MiB at a time:
// randbytes of the whole would hold the bytes twice (as an int first).
func startRandomHeap(b *testing.B, m *Manager, id string, size int64) {
	script := fmt.Sprintf("import random, time\nn = %d\nb = bytearray(n)\nfor i in range(0, n, 1 << 24): b[i:i + (1 << 24)] = random.randbytes(min(1 << 24, n - i))\nopen('/tmp/ready', 'w').close()\nwhile True: time.sleep(1)", size)
	if _, _, err := m.Exec(context.Background(), id, v1.ExecRequest{Detach: true, Args: []string{"python3", "-c", script}}); err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(m.sbRoot(id), "tmp/ready")); err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatal("the process did not fill its memory")
		}
	}
}

// twoHosts makes two daemons sharing a bucket of the tests' S3 server,
// the second trusting the first, with pools room for sandboxes of size
// bytes of memory: a hibernation, a migration's checkpoint and fetched
// copies, pages shared by content between them.
func twoHosts(b *testing.B, size int64) (m1, m2 *Manager, bucket *objstore.S3) {
	testPoolSize = max(8<<30, 3*size+4<<30)
	b.Cleanup(func() { testPoolSize = 0 })
	bucket = s3test.Start(b).OpenBucket(b, "")
	m1, second := trustingHosts(b, bucket)
	requireCRIU(b, m1)
	return m1, second(), bucket
}

func benchStoreResume(b *testing.B, size int64) {
	m1, m2, bucket := twoHosts(b, size)
	ctx := context.Background()
	sb, err := m1.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{MemoryBytes: size + 1<<30}})
	if err != nil {
		b.Fatal(err)
	}
	startRandomHeap(b, m1, sb.ID, size)
	var tUpload time.Duration
	var tLocal, tLocalWhole [2]time.Duration // eager, lazy
	var uploads, locals int
	// Resumes from the store, eager and lazy; for lazy ones also the
	// time until every page is local.
	var tStore, tWhole [2]time.Duration
	var resumes [2]int
	here, there := m1, m2
	// From the local pool, eager then lazy (lazy then eager on odd
	// iterations); a lazy one also timed until the lazy-pages daemon
	// has every page.
	local := func(i int) {
		for _, lazy := range [][]int{{0, 1}, {1, 0}}[i%2] {
			here.opts.noLazyResume = lazy == 0
			if _, err := here.Hibernate(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			before := counterValue(here.metrics.localLazy.WithLabelValues("ok"))
			start := time.Now()
			if _, err := here.Resume(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			tLocal[lazy] += time.Since(start)
			for lazy == 1 && counterValue(here.metrics.localLazy.WithLabelValues("ok")) == before {
				if time.Since(start) > 5*time.Minute {
					b.Fatal("the local lazy resume did not end")
				}
				time.Sleep(10 * time.Millisecond)
			}
			tLocalWhole[lazy] += time.Since(start)
			here.opts.noLazyResume = false
		}
		locals++
	}
	store := func() {
		// There and back twice, the sandbox ends where it began: eager,
		// lazy, lazy, eager.
		for _, lazy := range []int{0, 1, 1, 0} {
			if _, err := here.Hibernate(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			got, err := here.Offload(ctx, sb.ID)
			if err != nil {
				b.Fatal(err)
			}
			tUpload += time.Since(start)
			uploads++
			there.opts.noLazyResume = lazy == 0
			start = time.Now()
			if _, err := there.Resume(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			tStore[lazy] += time.Since(start)
			resumes[lazy]++
			// Settled: every page local before anything else runs.
			for {
				ck, err := there.CheckpointInfo(got.Head)
				if err != nil {
					b.Fatal(err)
				}
				if !ck.Offloaded {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			tWhole[lazy] += time.Since(start)
			there.opts.noLazyResume = false
			// The daemon it left forgets it (its copy is in the store).
			if err := here.Remove(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			here, there = there, here
		}
	}
	var tDown, tMigUp, tMigResume time.Duration
	var migrations int
	migrate := func() {
		for range 2 { // there and back
			mg, err := here.Migrate(ctx, sb.ID, managerTarget{there})
			if err != nil {
				b.Fatal(err)
			}
			ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
			tDown += ms(mg.DowntimeMS)
			tMigUp += ms(mg.UploadMS)
			tMigResume += ms(mg.ResumeMS)
			migrations++
			here, there = there, here
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			local(i)
			store()
			migrate()
		} else {
			migrate()
			store()
			local(i)
		}
	}
	b.StopTimer()
	msPer := func(d time.Duration, n int) float64 { return d.Seconds() * 1000 / float64(n) }
	local1, localLazy, localWhole := msPer(tLocal[0], locals), msPer(tLocal[1], locals), msPer(tLocalWhole[1], locals)
	eager, lazy, whole := msPer(tStore[0], resumes[0]), msPer(tStore[1], resumes[1]), msPer(tWhole[1], resumes[1])
	b.ReportMetric(local1, "local-resume-ms")
	b.ReportMetric(localLazy, "local-lazy-resume-ms")
	b.ReportMetric(eager, "store-eager-resume-ms")
	b.ReportMetric(lazy, "store-lazy-resume-ms")
	b.ReportMetric(whole, "store-lazy-whole-ms")
	b.ReportMetric(eager/lazy, "eager/lazy")
	b.ReportMetric(msPer(tUpload, uploads), "offload-ms")
	b.ReportMetric(msPer(tDown, migrations), "migrate-downtime-ms")
	b.Logf("%s: resume from the local pool eager %.0f ms, lazy %.0f ms (every page in after %.0f ms)", units.Bytes(size), local1, localLazy, localWhole)
	b.Logf("%s: resume from the local pool %.0f ms; from the store eager %.0f ms, lazy %.0f ms (eager/lazy %.2f; every page local after %.0f ms); offload %.0f ms (%d offloads); migration downtime (lazy resume) %.0f ms (upload %.0f ms, target's resume %.0f ms; %d migrations); store traffic %+v",
		units.Bytes(size), local1, eager, lazy, eager/lazy, whole, msPer(tUpload, uploads), uploads,
		msPer(tDown, migrations), msPer(tMigUp, migrations), msPer(tMigResume, migrations), migrations, bucket.Stats())
}

// BenchmarkStoreResumeTree measures resuming from the object store, on
// another daemon, an idle sandbox whose tree changed a little since its
// image (a shell, 8 MiB of new files, /etc edited): its file tree
// fetched whole (the baseline: every resume from the store did so) and
// fetched over the image the target has (only what the sandbox changed
// comes from the store; the image's files stay in place). Each
// iteration moves the sandbox there and back, one move each way, the
// order alternating between iterations; the resume is timed from the
// call until it returns with the tree running.
//
//	go test -run XXX -bench StoreResumeTree -benchtime 6x ./internal/core
func BenchmarkStoreResumeTree(b *testing.B) {
	bucket := s3test.Start(b).OpenBucket(b, "")
	m1, second := trustingHosts(b, bucket)
	requireCRIU(b, m1)
	m2 := second()
	ctx := context.Background()
	sb := newSandbox(b, m1)
	run(b, m1, sb.ID, "head -c 8M /dev/urandom > /root/data; echo moved > /etc/motd; (sleep 1000 >/dev/null 2>&1 &)")
	here, there := m1, m2
	var took [2]time.Duration // whole, over the image
	var moves [2]int
	move := func(over int) {
		if _, err := here.Hibernate(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		if _, err := here.Offload(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		there.opts.noTreeBase = over == 0
		start := time.Now()
		if _, err := there.Resume(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		took[over] += time.Since(start)
		moves[over]++
		there.opts.noTreeBase = false
		if err := here.Remove(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		here, there = there, here
	}
	move(1) // the store holds the tree, the image's index is built
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		move(i % 2)
		move(1 - i%2)
	}
	b.StopTimer()
	whole := took[0].Seconds() * 1000 / float64(moves[0])
	over := took[1].Seconds() * 1000 / float64(moves[1])
	b.ReportMetric(whole, "whole-tree-resume-ms")
	b.ReportMetric(over, "over-image-resume-ms")
	b.ReportMetric(whole/over, "whole/over")
	b.Logf("resume from the store on another daemon: tree fetched whole %.0f ms, over the image %.0f ms (whole/over %.2f; %d moves each)",
		whole, over, whole/over, moves[0])
}
