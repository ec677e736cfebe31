package criu

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fs"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"google.golang.org/protobuf/proto"
)

func asEntries[T proto.Message](all []T, err error) ([]imageEntry, error) {
	if err != nil {
		return nil, err
	}
	out := make([]imageEntry, len(all))
	for i, m := range all {
		out[i].msg = m
	}
	return out, nil
}

func one[T proto.Message](m T, err error) ([]imageEntry, error) {
	if err != nil {
		return nil, err
	}
	return []imageEntry{{msg: m}}, nil
}

// mergeReaders are the image readers of merge.go, by the image kind each
// reads (the first byte of a fuzz input picks one).
var mergeReaders = []struct {
	kind, file string
	read       func(path string) ([]imageEntry, error)
}{
	{"PSTREE", "pstree.img", func(p string) ([]imageEntry, error) { return asEntries(readImage[*pstree.PstreeEntry](p)) }},
	{"IDS", "ids-1.img", func(p string) ([]imageEntry, error) { return one(readOne[*criu_core.TaskKobjIdsEntry](p)) }},
	{"CORE", "core-1.img", func(p string) ([]imageEntry, error) { return one(readOne[*criu_core.CoreEntry](p)) }},
	{"FDINFO", "fdinfo-2.img", func(p string) ([]imageEntry, error) { return asEntries(readImage[*fdinfo.FdinfoEntry](p)) }},
	{"FILES", "files.img", func(p string) ([]imageEntry, error) { return asEntries(readImage[*fdinfo.FileEntry](p)) }},
	{"MM", "mm-1.img", func(p string) ([]imageEntry, error) {
		ents, err := one(readOne[*mm.MmEntry](p))
		if err != nil {
			return nil, err
		}
		// MappingStarts reads the same image by a process's number.
		starts, err := MappingStarts(filepath.Dir(p), 1)
		if err != nil || len(starts) > len(ents[0].msg.(*mm.MmEntry).GetVmas()) {
			panic("MappingStarts disagrees with the image it reads")
		}
		return ents, nil
	}},
	{"FS", "fs-1.img", func(p string) ([]imageEntry, error) { return one(readOne[*fs.FsEntry](p)) }},
	{"INVENTORY", "inventory.img", func(p string) ([]imageEntry, error) { return one(readOne[*inventory.InventoryEntry](p)) }},
	{"PAGEMAP", "pagemap-1.img", func(p string) ([]imageEntry, error) { _, e, err := readPagemap(p); return e, err }},
	{"PIPES_DATA", "pipes-data.img", readPipesData},
}

// FuzzMergeImages feeds arbitrary bytes to the CRIU image readers Merge
// uses. A reader never panics; what it accepts is written back by
// writeEntries and read again as the same entries and queued bytes; the
// queued bytes come from the file (never more than it holds); and the same
// file cut by one byte is refused, so a truncated image is never taken
// for a shorter one.
func FuzzMergeImages(f *testing.F) {
	// Seeds: testdata/fuzz/FuzzMergeImages (images of a real dump, and
	// cut or inflated ones).
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		r := mergeReaders[int(which)%len(mergeReaders)]
		dir := t.TempDir()
		path := filepath.Join(dir, r.file)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		ents, err := r.read(path)
		if err != nil {
			return
		}
		extra := 0
		for _, e := range ents {
			extra += len(e.extra)
		}
		if extra > len(data) {
			t.Fatalf("%s: %d queued bytes from a %d-byte file", r.kind, extra, len(data))
		}
		if len(data) > 0 {
			if err := os.WriteFile(path, data[:len(data)-1], 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := r.read(path); err == nil {
				t.Fatalf("%s: the image cut by one byte was accepted", r.kind)
			}
		}
		os.Remove(path)
		if err := writeEntries(path, r.kind, ents); err != nil {
			t.Fatalf("%s: write back: %v", r.kind, err)
		}
		again, err := r.read(path)
		if err != nil {
			t.Fatalf("%s: the written image is refused: %v", r.kind, err)
		}
		if len(again) != len(ents) {
			t.Fatalf("%s: %d entries written, %d read", r.kind, len(ents), len(again))
		}
		for i := range ents {
			if !proto.Equal(ents[i].msg, again[i].msg) || !bytes.Equal(ents[i].extra, again[i].extra) {
				t.Fatalf("%s: entry %d changed on the round trip", r.kind, i)
			}
		}
	})
}
