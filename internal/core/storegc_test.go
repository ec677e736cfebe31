package core

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/remote"
)

// TestStoreGCAfterDelete, on the real S3 server: deleting a checkpoint
// deletes its recipe in the store, and two GC runs a grace period apart
// delete the packs only it named, while a live checkpoint still fetches
// whole; removing the sandbox deletes its other recipes, and the store
// then holds no pack.
func TestStoreGCAfterDelete(t *testing.T) {
	bucket := testBucket(t)
	m := openManagerStore(t, bucket)
	ctx := context.Background()
	sb := newSandbox(t, m)
	put := func(name string) ([]byte, string) {
		t.Helper()
		b := make([]byte, 4<<20)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(m.sbRoot(sb.ID), name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS, Wait: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.putCheckpoint(ctx, nil, ck.ID); err != nil {
			t.Fatal(err)
		}
		return b, ck.ID
	}
	// The image's files go up first, in packs of their own: a pack is
	// deleted only when no recipe names it.
	base, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.putCheckpoint(ctx, nil, base.ID); err != nil {
		t.Fatal(err)
	}
	_, ck1 := put("one.bin")
	if err := os.Remove(filepath.Join(m.sbRoot(sb.ID), "one.bin")); err != nil {
		t.Fatal(err)
	}
	two, ck2 := put("two.bin")
	packs := func() int {
		t.Helper()
		keys, err := bucket.List(ctx, "packs/")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, k := range keys {
			if !strings.HasSuffix(k, ".idx") {
				n++
			}
		}
		return n
	}
	before := packs()
	gone := func(id string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if _, err := m.store.Recipe(ctx, id); errors.Is(err, fs.ErrNotExist) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the recipe of %s is still in the store", id)
			}
		}
	}
	if err := m.DeleteCheckpoint(ctx, ck1); err != nil {
		t.Fatal(err)
	}
	gone(ck1)
	t0 := time.Now()
	gc := func(at time.Duration) remote.GCReport {
		t.Helper()
		rep, err := m.StoreGC(ctx, remote.GCOptions{Grace: time.Minute, Now: func() time.Time { return t0.Add(at) }})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	if rep := gc(0); rep.Condemned == 0 || rep.DeletedPacks != 0 {
		t.Fatalf("first run: %+v", rep)
	}
	if rep := gc(2 * time.Minute); rep.DeletedPacks == 0 || rep.DeletedBytes < 4<<20 {
		t.Fatalf("second run: %+v, want ck1's 4 MiB file's packs deleted", rep)
	}
	if n := packs(); n >= before {
		t.Fatalf("%d packs before, %d after", before, n)
	}
	fetchFile(t, m, ck2, "two.bin", two)

	if err := m.Remove(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	gone(ck2)
	gone(base.ID)
	gc(4 * time.Minute)
	gc(6 * time.Minute)
	if n := packs(); n != 0 {
		t.Fatalf("%d packs left once the sandbox is removed", n)
	}
}

// fetchFile fetches checkpoint id's tree from m's store and checks its
// file name.
func fetchFile(t *testing.T, m *Manager, id, name string, want []byte) {
	t.Helper()
	ctx := context.Background()
	r, err := m.store.Recipe(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := m.store.FetchTree(ctx, r, dir); err != nil {
		t.Fatalf("fetch %s: %v", id, err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s of %s: %v", name, id, err)
	}
}

// TestStoreDrops: the deletions queued in the pool are done by the
// worker in order, stay queued while the store fails them, and leave
// alone a sandbox whose document another host claimed.
func TestStoreDrops(t *testing.T) {
	// The worker does only what it is woken for: this test calls doDrops.
	// (Put back after the manager's close: cleanups run last first.)
	old := dropRetry
	t.Cleanup(func() { dropRetry = old })
	dropRetry = time.Hour
	m := openManagerStore(t, testBucket(t))
	ctx := context.Background()
	sb := newSandbox(t, m)
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.putCheckpoint(ctx, nil, ck.ID); err != nil {
		t.Fatal(err)
	}
	queue := func(d storeDrop) string {
		t.Helper()
		if err := os.MkdirAll(m.dropDir(), 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(d)
		p := filepath.Join(m.dropDir(), "00000000-"+d.Sandbox+".json")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	inStore := func() bool {
		_, err := m.store.Recipe(ctx, ck.ID)
		return err == nil
	}
	// Another host claimed the sandbox: its recipes are its.
	doc := remote.SandboxDoc{Sandbox: sb.ID, Head: ck.ID, Record: []byte(`{}`), Owner: "ed25519:0000000000000000"}
	forceDoc(t, m, doc)
	p := queue(storeDrop{Sandbox: sb.ID, Head: ck.ID, Recipes: []string{ck.ID}, Whole: true})
	m.doDrops(ctx)
	if !inStore() {
		t.Fatal("a drop deleted the recipe of a sandbox another host claimed")
	}
	if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the done drop is still queued: %v", err)
	}
	// A store that fails: it stays queued.
	doc.Owner = ""
	forceDoc(t, m, doc)
	p = queue(storeDrop{Sandbox: sb.ID, Head: ck.ID, Recipes: []string{ck.ID}, Whole: true})
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	m.doDrops(cctx)
	if _, err := os.Stat(p); err != nil || !inStore() {
		t.Fatalf("a drop the store failed: queued %v, recipe there %v", err, inStore())
	}
	m.doDrops(ctx)
	if inStore() {
		t.Fatal("the recipe of a sandbox offloaded here and removed is still in the store")
	}
	if _, err := m.store.Sandbox(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("its document: %v", err)
	}
}

// forceDoc writes doc over whatever document the store holds.
func forceDoc(t *testing.T, m *Manager, doc remote.SandboxDoc) {
	t.Helper()
	ctx := context.Background()
	_, version, err := m.store.SandboxVersion(ctx, doc.Sandbox)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatal(err)
	}
	if err := m.store.PutSandbox(ctx, doc, version); err != nil {
		t.Fatal(err)
	}
}
