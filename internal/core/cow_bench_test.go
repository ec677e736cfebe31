package core

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/capture"
	"github.com/molt-sh/molt/internal/meta"
)

// rewriter holds 100 MiB and, when /tmp/touch appears, writes one byte
// in each of its pages and reports how long that took (ms) in /tmp/took.
const rewriter = `
import os, time
n = 100 << 20
b = bytearray(n)
b[:] = b'A' * n
open('/tmp/ready', 'w').close()
k = 0
while True:
    time.sleep(0.001)
    if os.path.exists('/tmp/touch'):
        os.remove('/tmp/touch')
        k += 1
        t = time.perf_counter()
        b[::4096] = bytes([65 + k % 26]) * len(range(0, n, 4096))
        d = time.perf_counter() - t
        with open('/tmp/took.tmp', 'w') as f:
            f.write('%.3f' % (d * 1000))
        os.rename('/tmp/took.tmp', '/tmp/took')
`

// BenchmarkCOWRewrite measures what a copy-on-write capture costs the
// process after the thaw: the first write to each page faults (a copy
// while the checkpoint still holds the page, a cheaper fault once it is
// stored). A Python process with 100 MiB writes one byte in each of its
// 25,600 pages: with no checkpoint, right after a capture that copied
// its pages frozen, right after a copy-on-write capture (while the
// checkpoint is being stored), and after a copy-on-write capture once
// it is committed. One run prints all four:
//
//	go test -run XXX -bench COWRewrite -benchtime 1x ./internal/core
func BenchmarkCOWRewrite(b *testing.B) {
	m := openCOWManager(b)
	requireCRIU(b, m)
	ctx := context.Background()
	sb := pythonSandbox(b, m, rewriter)
	root := m.sbRoot(sb.ID)
	touch := func() float64 {
		b.Helper()
		took := filepath.Join(root, "tmp", "took")
		_ = os.Remove(took)
		if err := os.WriteFile(filepath.Join(root, "tmp", "touch"), nil, 0o644); err != nil {
			b.Fatal(err)
		}
		for deadline := time.Now().Add(20 * time.Second); ; {
			if s, err := os.ReadFile(took); err == nil {
				ms, err := strconv.ParseFloat(strings.TrimSpace(string(s)), 64)
				if err != nil {
					b.Fatal(err)
				}
				return ms
			}
			if time.Now().After(deadline) {
				b.Fatal("no rewrite within 20 s")
			}
			time.Sleep(200 * time.Microsecond)
		}
	}
	capture := func(cow bool) meta.Checkpoint {
		b.Helper()
		m.opts.noCOWCapture = !cow
		ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull})
		if err != nil {
			b.Fatal(err)
		}
		want := capture.Copy
		if cow {
			want = capture.COW
		}
		if ck.Capture != want {
			b.Fatalf("capture %q (%s), want %q", ck.Capture, ck.CaptureNote, want)
		}
		return ck
	}
	commit := func(ck meta.Checkpoint) {
		b.Helper()
		if _, err := m.awaitCheckpoint(ctx, ck.ID); err != nil {
			b.Fatal(err)
		}
		m.waitHot()
	}
	const samples = 7
	var none, afterCopy, afterCOW, committedCOW []float64
	for i := 0; i < samples; i++ {
		touch() // every page written and writable again
		none = append(none, touch())

		ck := capture(false)
		afterCopy = append(afterCopy, touch())
		commit(ck)

		ck = capture(true)
		afterCOW = append(afterCOW, touch())
		commit(ck)

		ck = capture(true)
		commit(ck)
		committedCOW = append(committedCOW, touch())
	}
	med := func(v []float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		return v[len(v)/2]
	}
	b.ReportMetric(med(none), "ms/rewrite-none")
	b.ReportMetric(med(afterCopy), "ms/rewrite-after-copy")
	b.ReportMetric(med(afterCOW), "ms/rewrite-after-cow")
	b.ReportMetric(med(committedCOW), "ms/rewrite-after-cow-committed")
	fmt.Printf("one byte into each of 25,600 pages (100 MiB), median of %d (ms):\n", samples)
	fmt.Printf("  no checkpoint                               %6.1f\n", med(none))
	fmt.Printf("  right after a capture that copied frozen    %6.1f\n", med(afterCopy))
	fmt.Printf("  right after a copy-on-write capture         %6.1f\n", med(afterCOW))
	fmt.Printf("  after a copy-on-write capture, committed    %6.1f\n", med(committedCOW))
}
