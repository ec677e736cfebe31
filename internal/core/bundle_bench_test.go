package core

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/fsnap"
)

// BenchmarkCheckpointBundle measures checkpoint export and import
// against tar of the same checkpoint directory (its file tree and its
// images; GNU tar with xattrs, numeric owners) on the same disks, in
// alternating order. The checkpoint is a full one of a sandbox whose
// Python process holds 64 MiB of random memory, on the Debian test
// image. Export writes the bundle to a file; import reads it back into
// the pool as a new checkpoint (verified, images validated and stored,
// the tree extracted into a subvolume and snapshotted); tar -x extracts
// into a fresh subvolume of the pool, checking nothing. One run prints
// both:
//
//	go test -run XXX -bench CheckpointBundle -benchtime 5x ./internal/core
func BenchmarkCheckpointBundle(b *testing.B) {
	m := openManager(b)
	requireCRIU(b, m)
	if _, err := exec.LookPath("tar"); err != nil {
		b.Skip("no tar")
	}
	ctx := context.Background()
	sb := pythonSandbox(b, m, "import os, time\nb = bytearray(os.urandom(64 << 20))\nopen('/tmp/ready', 'w').close()\nwhile True: time.sleep(1)")
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	bundleFile, tarFile := filepath.Join(dir, "ck.molt"), filepath.Join(dir, "ck.tar")
	var tExport, tTarC, tImport, tTarX time.Duration
	exportOnce := func() {
		start := time.Now()
		f, err := os.Create(bundleFile)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := m.ExportCheckpoint(ctx, ck.ID, f); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		tExport += time.Since(start)
	}
	tarOnce := func() {
		start := time.Now()
		out, err := exec.Command("tar", "--xattrs", "--numeric-owner", "-cf", tarFile, "-C", m.ckDir(ck.ID), "fs", "images").CombinedOutput()
		if err != nil {
			b.Fatalf("tar -c: %v: %s", err, out)
		}
		tTarC += time.Since(start)
	}
	importOnce := func() {
		start := time.Now()
		id, err := importFile(m, bundleFile)
		if err != nil {
			b.Fatal(err)
		}
		tImport += time.Since(start)
		if err := m.DeleteCheckpoint(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	untarOnce := func() {
		dst := m.path("tmp", "untar-"+newID())
		if err := fsnap.CreateSubvolume(dst); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		out, err := exec.Command("tar", "--xattrs", "--numeric-owner", "-xf", tarFile, "-C", dst).CombinedOutput()
		if err != nil {
			b.Fatalf("tar -x: %v: %s", err, out)
		}
		if err := fsnap.SyncFS(dst); err != nil {
			b.Fatal(err)
		}
		tTarX += time.Since(start)
		if err := removeTree(dst); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			exportOnce()
			tarOnce()
			importOnce()
			untarOnce()
		} else {
			tarOnce()
			exportOnce()
			untarOnce()
			importOnce()
		}
	}
	b.StopTimer()
	bs, _ := os.Stat(bundleFile)
	ts, _ := os.Stat(tarFile)
	mbps := func(size int64, d time.Duration) float64 {
		return float64(size) / (1 << 20) / (d.Seconds() / float64(b.N))
	}
	b.ReportMetric(float64(bs.Size())/(1<<20), "bundle-MiB")
	b.ReportMetric(float64(ts.Size())/(1<<20), "tar-MiB")
	b.ReportMetric(mbps(bs.Size(), tExport), "export-MiB/s")
	b.ReportMetric(mbps(ts.Size(), tTarC), "tar-c-MiB/s")
	b.ReportMetric(mbps(bs.Size(), tImport), "import-MiB/s")
	b.ReportMetric(mbps(ts.Size(), tTarX), "tar-x-MiB/s")
	b.ReportMetric(tExport.Seconds()*1000/float64(b.N), "export-ms")
	b.ReportMetric(tTarC.Seconds()*1000/float64(b.N), "tar-c-ms")
	b.ReportMetric(tImport.Seconds()*1000/float64(b.N), "import-ms")
	b.ReportMetric(tTarX.Seconds()*1000/float64(b.N), "tar-x-ms")
}
