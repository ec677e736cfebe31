package meta

import (
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// testDisk lays out a pool in dir as the engine does: sandboxes/ID/
// with sandbox.json and root, checkpoints/ID/manifest.json (the
// record itself, for the test), images/NAME and images/.NAME.json.
func testDisk(t testing.TB, dir string) *Disk {
	t.Helper()
	for _, d := range []string{"images", "sandboxes", "checkpoints", "quarantine"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return &Disk{
		Log:          slog.New(slog.DiscardHandler),
		SandboxCopy:  func(id string) string { return filepath.Join(dir, "sandboxes", id, "sandbox.json") },
		ImageCopy:    func(name string) string { return filepath.Join(dir, "images", "."+name+".json") },
		ManifestCopy: func(id string) string { return filepath.Join(dir, "checkpoints", id, "manifest.json") },
		CommittedManifest: func(ck CheckpointRecord) []byte {
			b, _ := json.Marshal(ck)
			return b
		},
		ManifestCurrent: func(CheckpointRecord) bool { return false },
		Background:      func() (func(), error) { return func() {}, nil },
		List: func(kind string) []fs.DirEntry {
			ents, _ := os.ReadDir(filepath.Join(dir, kind))
			return ents
		},
		ValidName: func(kind, name string) error {
			if name == "" || name[0] == '-' {
				return errors.New("bad name")
			}
			return nil
		},
		Checkpoint: func(id string) (CheckpointRecord, string) {
			var ck CheckpointRecord
			b, err := os.ReadFile(filepath.Join(dir, "checkpoints", id, "manifest.json"))
			if err != nil || json.Unmarshal(b, &ck) != nil || ck.ID != id {
				return ck, "no manifest"
			}
			return ck, ""
		},
		SandboxRoot: func(id string) string { return filepath.Join(dir, "sandboxes", id, "root") },
		Quarantine: func(path, name, why string) error {
			return os.Rename(path, filepath.Join(dir, "quarantine", name))
		},
	}
}

func openTemp(t testing.TB) *DB {
	t.Helper()
	d, err := Open(filepath.Join(t.TempDir(), "molt.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func readCopy[T any](t *testing.T, file string) (T, error) {
	t.Helper()
	var v T
	b, err := os.ReadFile(file)
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	return v, err
}

// TestCopiesFollowRecords checks that every put reaches its copy once
// the writer is closed, that a delete removes the copy before it
// returns, and that a record whose directory is gone writes nothing.
func TestCopiesFollowRecords(t *testing.T) {
	dir := t.TempDir()
	p := testDisk(t, dir)
	d := openTemp(t)
	for _, id := range []string{"a", "b"} {
		if err := os.MkdirAll(filepath.Join(dir, "sandboxes", id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "checkpoints", "c"), 0o700); err != nil {
		t.Fatal(err)
	}
	c := d.KeepCopies(p)
	for _, id := range []string{"a", "b", "gone"} {
		if err := d.Put(Sandboxes, id, SandboxRecord{Sandbox: Sandbox{ID: id, Name: "n" + id}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Put(Checkpoints, "c", CheckpointRecord{Checkpoint: Checkpoint{ID: "c", Sandbox: "a"}}); err != nil {
		t.Fatal(err)
	}
	if err := d.Put(Images, "img", Image{Name: "img", Source: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(Sandboxes, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.SandboxCopy("b")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the copy of a deleted record after the delete returned: %v", err)
	}
	c.Close()
	c.Close()
	if s, err := readCopy[SandboxRecord](t, p.SandboxCopy("a")); err != nil || s.Name != "na" {
		t.Fatalf("sandbox copy: %+v, %v", s, err)
	}
	if ck, err := readCopy[CheckpointRecord](t, p.ManifestCopy("c")); err != nil || ck.Sandbox != "a" {
		t.Fatalf("checkpoint copy: %+v, %v", ck, err)
	}
	if img, err := readCopy[Image](t, p.ImageCopy("img")); err != nil || img.Source != "test" {
		t.Fatalf("image copy: %+v, %v", img, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sandboxes", "gone")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a copy made the directory of a record whose object is gone: %v", err)
	}
	var nilCopies *Copies
	nilCopies.Close()
}

// TestCopiesOlderLoses checks that a copy queued by an older
// transaction than the last write or removal of its file is dropped.
func TestCopiesOlderLoses(t *testing.T) {
	dir := t.TempDir()
	p := testDisk(t, dir)
	if err := os.MkdirAll(filepath.Join(dir, "sandboxes", "a"), 0o700); err != nil {
		t.Fatal(err)
	}
	c := openTemp(t).KeepCopies(p)
	file := p.SandboxCopy("a")
	c.queue(file, copyWrite{txid: 10})
	c.queue(file, copyWrite{txid: 9, b: []byte(`{"id":"a"}`)})
	c.Close()
	if _, err := os.Stat(file); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a copy older than the removal was written: %v", err)
	}
}

// TestHealWritesMissingCopies checks that Heal writes the copies the
// disk lacks.
func TestHealWritesMissingCopies(t *testing.T) {
	dir := t.TempDir()
	p := testDisk(t, dir)
	for _, d := range []string{"sandboxes/a", "checkpoints/c"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	d := openTemp(t)
	if err := d.Put(Images, "img", Image{Name: "img"}); err != nil {
		t.Fatal(err)
	}
	// Records put before the copies were kept have none.
	c := d.KeepCopies(p)
	c.Heal([]SandboxRecord{{Sandbox: Sandbox{ID: "a"}}}, []CheckpointRecord{{Checkpoint: Checkpoint{ID: "c"}}})
	c.Close()
	for _, f := range []string{p.SandboxCopy("a"), p.ManifestCopy("c"), p.ImageCopy("img")} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("after Heal: %v", err)
		}
	}
	// Copies that are current are not written again (an image's copy
	// once was, at every start: its name was looked up without the
	// leading dot).
	before := map[string]os.FileInfo{}
	for _, f := range []string{p.SandboxCopy("a"), p.ImageCopy("img")} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		before[f] = fi
	}
	c = d.KeepCopies(p)
	c.Heal([]SandboxRecord{{Sandbox: Sandbox{ID: "a"}}}, nil)
	c.Close()
	for f, fi := range before {
		now, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if !os.SameFile(fi, now) {
			t.Errorf("%s written again though current", filepath.Base(f))
		}
	}
}

// TestOpenRecordsSetsAsideCorrupt checks that a file that is no
// database, and one whose records are not molt's, are set aside and a
// fresh database opened in their place.
func TestOpenRecordsSetsAsideCorrupt(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for name, damage := range map[string]func(path string){
		"garbage": func(path string) {
			if err := os.WriteFile(path, []byte("not a database, and long enough to not be empty either"), 0o600); err != nil {
				t.Fatal(err)
			}
		},
		"records": func(path string) {
			d, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Update(func(tx *Tx) error { return tx.PutRaw(Sandboxes, "a", []byte(`{"id":5}`)) }); err != nil {
				t.Fatal(err)
			}
			d.Close()
		},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "molt.db")
			damage(path)
			d, err := OpenRecords(path, log)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if !d.Fresh() {
				t.Fatal("the database opened in place of a corrupt one is not fresh")
			}
			if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) != 1 {
				t.Fatalf("set aside: %v", aside)
			}
		})
	}
}

// TestRebuildFromCopies checks that Rebuild lists what the copies
// explain and quarantines the rest.
func TestRebuildFromCopies(t *testing.T) {
	dir := t.TempDir()
	p := testDisk(t, dir)
	put := func(file string, v any) {
		if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(v)
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		put(p.SandboxCopy(id), SandboxRecord{Sandbox: Sandbox{ID: id, Name: "same"}})
		if id != "c" {
			if err := os.Mkdir(p.SandboxRoot(id), 0o700); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(p.ManifestCopy("k1"), CheckpointRecord{Checkpoint: Checkpoint{ID: "k1", Sandbox: "a", Parent: "lost"}})
	put(p.ManifestCopy("k2"), CheckpointRecord{Checkpoint: Checkpoint{ID: "other"}})
	if err := os.MkdirAll(filepath.Join(dir, "images", "img"), 0o700); err != nil {
		t.Fatal(err)
	}
	d := openTemp(t)
	if err := d.Rebuild(p); err != nil {
		t.Fatal(err)
	}
	if d.Fresh() {
		t.Fatal("fresh after the rebuild")
	}
	sbs, _ := List[SandboxRecord](d, Sandboxes)
	if len(sbs) != 2 || sbs[0].ID != "a" || sbs[0].Name != "same" || sbs[1].Name != "" {
		t.Fatalf("sandboxes: %+v; want a with the name, b without it", sbs)
	}
	cks, _ := List[CheckpointRecord](d, Checkpoints)
	if len(cks) != 1 || cks[0].ID != "k1" || cks[0].Parent != "" {
		t.Fatalf("checkpoints: %+v; want k1, a root", cks)
	}
	imgs, _ := List[Image](d, Images)
	if len(imgs) != 1 || imgs[0].Name != "img" || imgs[0].Source != "unknown (rebuilt from the pool)" {
		t.Fatalf("images: %+v", imgs)
	}
	q, _ := os.ReadDir(filepath.Join(dir, "quarantine"))
	if len(q) != 2 || q[0].Name() != "checkpoint-k2" || q[1].Name() != "sandbox-c" {
		t.Fatalf("quarantine: %v", q)
	}
}

// BenchmarkSandboxRecord measures what a sandbox's on-disk record
// costs: what the commit point pays (queue), the writer's write by
// rename (rename), and that write with the fsyncs of the file and its
// directory (fsync), which the writer batches.
func BenchmarkSandboxRecord(b *testing.B) {
	dir := b.TempDir()
	p := testDisk(b, dir)
	if err := os.MkdirAll(filepath.Join(dir, "sandboxes", "a"), 0o700); err != nil {
		b.Fatal(err)
	}
	c := openTemp(b).KeepCopies(p)
	defer c.Close()
	rec, _ := json.Marshal(SandboxRecord{Sandbox: Sandbox{ID: "a"}})
	file := p.SandboxCopy("a")
	b.Run("queue", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			c.queue(file, copyWrite{txid: 1<<40 + uint64(i), b: rec})
		}
	})
	b.Run("rename", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := replaceFile(file, rec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fsync", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := replaceFile(file, rec); err != nil {
				b.Fatal(err)
			}
			if err := syncPath(file); err != nil {
				b.Fatal(err)
			}
			if err := syncPath(filepath.Dir(file)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
