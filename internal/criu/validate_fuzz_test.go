package criu

import (
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"testing"
)

// fuzzLimits are small, so that an allocation that follows a size read
// from the input instead of the input's own size shows.
var fuzzLimits = Limits{Files: 256, ImageBytes: 1 << 20, EntryBytes: 1 << 16, Entries: 1 << 12, Tasks: 1 << 10, PagesBytes: 1 << 24, Mounts: 64, Path: 4096}

// fuzzBase is sandboxDump, read once: names sorted, then names of image
// kinds it lacks (a fuzz input may add one).
var fuzzBase = sync.OnceValues(func() ([]string, map[string][]byte) {
	files := map[string][]byte{}
	ents, err := os.ReadDir(sandboxDump)
	if err != nil {
		panic(err)
	}
	var names []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(sandboxDump, e.Name()))
		if err != nil {
			panic(err)
		}
		files[e.Name()] = b
		names = append(names, e.Name())
	}
	sort.Strings(names)
	names = append(names, "ghost-file-1.img", "remap-fpath.img", "tcp-stream-a.img", "sk-queues.img", "fifo-data.img",
		"tty-info.img", "tty-data.img", "netns-1.img", "netdev-1.img", "ifaddr-1.img", "tmpfs-dev-60.tar.gz.img",
		"pagemap-shmem-1.img", "filelocks.img", "utsns-1.img", "unknown.img")
	return names, files
})

// FuzzValidateImages replaces (or adds) one file of a real sandbox's
// dump with arbitrary bytes and validates the set. It never panics; it
// allocates within a bound of the input's size, never in proportion to
// a size or count read from it; and a set it accepts is accepted again,
// also once the fuzzed image is decoded and written back.
func FuzzValidateImages(f *testing.F) {
	names, files := fuzzBase()
	for i, n := range names {
		f.Add(uint8(i), files[n])
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		names, files := fuzzBase()
		name := names[int(which)%len(names)]
		dir := t.TempDir()
		total := len(data)
		for n, b := range files {
			if n == name {
				continue
			}
			total += len(b)
			if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := ValidateImages(dir, fuzzLimits)
		runtime.ReadMemStats(&after)
		if got, bound := after.TotalAlloc-before.TotalAlloc, uint64(64*total+8<<20); got > bound {
			t.Fatalf("validation of %d input bytes allocated %d bytes (bound %d)", total, got, bound)
		}
		if err != nil {
			return
		}
		if err := ValidateImages(dir, fuzzLimits); err != nil {
			t.Fatalf("accepted once, then refused: %v", err)
		}
		k, _, kerr := kindOf(name)
		if kerr != nil || k == nil {
			return
		}
		im, err := decodeKind(name, data, k, fuzzLimits)
		if err != nil {
			t.Fatalf("%s accepted in the set, refused alone: %v", name, err)
		}
		if k.kind == "GHOST_FILE" {
			return // its content is not entries
		}
		os.Remove(p)
		if err := writeEntries(p, k.kind, im.entries); err != nil {
			t.Fatal(err)
		}
		if err := ValidateImages(dir, fuzzLimits); err != nil {
			t.Fatalf("%s written back from its entries is refused: %v", name, err)
		}
	})
}
