package remote

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/objstore"
)

// BenchmarkUploadKnownPages uploads a checkpoint of a 256 MiB page image
// whose pages the store has, with one page in 64 new: the final
// checkpoint of a migration or an offload after a committed one. Each
// iteration uploads it twice, reading and hashing every page (the way
// uploads went before) and naming the known pages by the checkpoint's
// hash file, the order alternating; it reports both and their ratio.
//
//	go test -run XXX -bench UploadKnownPages -benchtime 6x ./internal/remote
func BenchmarkUploadKnownPages(b *testing.B) {
	ctx := context.Background()
	bk, err := objstore.NewDir(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	s, err := Open(ctx, bk, keyring(b))
	if err != nil {
		b.Fatal(err)
	}
	const n = 256 << 20 / 4096
	pages := randomPages(b, n)
	if _, _, err := s.Upload(ctx, artifact(b, "ck0000000000", pages, "base")); err != nil {
		b.Fatal(err)
	}
	var took [2]time.Duration // whole, by hash
	var read [2]int64
	b.ResetTimer()
	for i := range b.N {
		for k := range 2 {
			byHash := (i+k)%2 == 1
			next := bytes.Clone(pages)
			for p := i*2 + k; p < n; p += 64 {
				copy(next[p*4096:], randomPages(b, 1))
			}
			src := artifact(b, fmt.Sprintf("ck%010d", 1+i*2+k), next, "x")
			s.readWhole = !byHash
			start := time.Now()
			_, st, err := s.Upload(ctx, src)
			d := time.Since(start)
			if err != nil {
				b.Fatal(err)
			}
			j := 0
			if byHash {
				j = 1
			}
			took[j] += d
			read[j] += st.ReadBytes
		}
	}
	s.readWhole = false
	per := func(d time.Duration) float64 { return float64(d.Milliseconds()) / float64(b.N) }
	b.ReportMetric(per(took[0]), "ms/whole")
	b.ReportMetric(per(took[1]), "ms/by-hash")
	b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "whole/by-hash")
	b.ReportMetric(float64(read[0])/float64(b.N)/(1<<20), "MiB-read/whole")
	b.ReportMetric(float64(read[1])/float64(b.N)/(1<<20), "MiB-read/by-hash")
}
