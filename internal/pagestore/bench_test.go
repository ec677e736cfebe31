package pagestore

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/molt-sh/molt/internal/testutil/btrfstest"
)

// BenchmarkStore measures storing a 128 MiB page image into the pool
// twice: new (every page written) and again (every page known, shared
// by reflinks): the copy a full checkpoint of a process of that memory
// makes after its dump, without and with its pages in earlier
// checkpoints. Compare commits with
//
//	go test -run XXX -bench BenchmarkStore -benchtime 5x ./internal/pagestore
func BenchmarkStore(b *testing.B) {
	dir := btrfstest.Dir(b)
	src := filepath.Join(b.TempDir(), "pages.img")
	if err := os.WriteFile(src, randomPages(128<<20/PageSize), 0o600); err != nil {
		b.Fatal(err)
	}
	for _, again := range []bool{false, true} {
		name := "new"
		if again {
			name = "known"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(128 << 20)
			for i := range b.N {
				b.StopTimer()
				os.Remove(filepath.Join(dir, "pages-"+name))
				usedBytes(b, dir) // a commit: the space of what went is free
				x := NewIndex()
				if again {
					if _, err := Store(src, filepath.Join(dir, "seed"), x); err != nil {
						b.Fatal(err)
					}
				}
				dst := filepath.Join(dir, "pages-"+name)
				b.StartTimer()
				if _, err := Store(src, dst, x); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				os.Remove(filepath.Join(dir, "seed"))
				_ = i
			}
		})
	}
}
