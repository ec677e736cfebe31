package core

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/keys"
	"github.com/molt-sh/molt/internal/testutil"
)

// openEncrypted opens a Manager on a fresh root with encryption at rest
// on (a random KEK), with room for standbys.
func openEncrypted(t *testing.T) *Manager {
	t.Helper()
	testutil.RequireRoot(t)
	raw := make([]byte, keys.KeySize)
	rand.Read(raw)
	kek, err := keys.NewKEK(raw)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Open(context.Background(), Config{Root: t.TempDir(), PoolSize: 8 << 30, CacheDir: os.Getenv("MOLT_CACHE_DIR"), KEK: kek, StandbyBudget: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	if _, err := m.BuildImage(context.Background(), v1.ImageBuildRequest{Name: testImage}, nil); err != nil {
		t.Fatal(err)
	}
	requireCRIU(t, m)
	return m
}

// grepTree reports the files under dir that hold needle.
func grepTree(t *testing.T, dir string, needle []byte) []string {
	t.Helper()
	var hits []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, needle) {
			hits = append(hits, p)
		}
		return nil
	})
	return hits
}

// TestEncryptedCheckpoints: with a KEK, a full checkpoint's images hold
// no plaintext of the sandbox's memory (which its decrypted view does),
// restore on every tier and fork; after a data key rotation old and new
// checkpoints both restore; after the key is shredded none restores
// (and the error says so), while the running sandbox is untouched.
func TestEncryptedCheckpoints(t *testing.T) {
	m := openEncrypted(t)
	ctx := context.Background()
	sb := newSandbox(t, m)
	secret := "molt-secret-" + hex.EncodeToString([]byte(t.Name()))[:16]
	run(t, m, sb.ID, "export X=a S="+secret)
	a, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Label: "a", Keep: true, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if a.DataKey == "" {
		t.Fatal("a full checkpoint with a KEK has no data key")
	}
	ck, err := m.lookupCheckpoint(a.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	// The images are sealed: the pool holds no copy of the secret,
	// while the plaintext the restore reads does (so the search can
	// find it).
	if hits := grepTree(t, m.cks.Images(a.ID), []byte(secret)); len(hits) > 0 {
		t.Fatalf("sealed images hold the secret in plaintext: %v", hits)
	}
	dir, done, err := m.openImages(ck)
	if err != nil {
		t.Fatal(err)
	}
	if hits := grepTree(t, dir, []byte(secret)); len(hits) == 0 {
		t.Fatal("the decrypted images do not hold the secret: the search proves nothing")
	}
	if !strings.HasPrefix(dir, "/dev/shm/") {
		t.Fatalf("images decrypted to %s, not to memory", dir)
	}
	done()
	// They linger a moment for the next restore, then go.
	deadline := time.Now().Add(pagesLinger + 10*time.Second)
	for {
		ents, _ := filepath.Glob(filepath.Join(dir, "pages-*.img"))
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("decrypted pages left after the restore's end: %v", ents)
		}
		time.Sleep(100 * time.Millisecond)
	}

	run(t, m, sb.ID, "export X=b")
	b, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Label: "b", Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	m.pipe.wg.Wait()
	m.waitHot()
	rollbackTo(t, m, sb.ID, a, v1.TierHot, "a")
	for _, tier := range []string{v1.TierWarm, v1.TierCold} {
		res, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: b.ID, Tier: tier})
		if err != nil || res.Tier != tier {
			t.Fatalf("%s rollback to b: %+v, %v", tier, res, err)
		}
		if r := run(t, m, sb.ID, "echo $X"); r.Stdout != "b\n" {
			t.Fatalf("%s rollback to b: X=%q", tier, r.Stdout)
		}
	}
	forks, err := m.Fork(ctx, a.ID, v1.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r := run(t, m, forks.Sandboxes[0].ID, "echo $X"); r.Stdout != "a\n" {
		t.Fatalf("fork of a: X=%q", r.Stdout)
	}

	// Rotation: new checkpoints get the new key, old ones still restore.
	nk, err := m.RotateDataKey("")
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "export X=c")
	c, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Label: "c", Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if c.DataKey != nk.ID || c.DataKey == a.DataKey {
		t.Fatalf("checkpoint after the rotation sealed with %s, want %s", c.DataKey, nk.ID)
	}
	for _, want := range []struct{ id, x string }{{a.ID, "a"}, {c.ID, "c"}} {
		if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: want.id, Tier: v1.TierWarm}); err != nil {
			t.Fatalf("rollback to %s after the rotation: %v", want.x, err)
		}
		if r := run(t, m, sb.ID, "echo $X"); r.Stdout != want.x+"\n" {
			t.Fatalf("after the rotation: X=%q, want %s", r.Stdout, want.x)
		}
	}

	// Shredding: nothing sealed restores, on any tier (the standbys
	// went with the keys); the sandbox itself runs on.
	if n, err := m.ShredDataKeys(""); err != nil || n != 2 {
		t.Fatalf("shred: %d keys, %v", n, err)
	}
	for _, tier := range []string{"", v1.TierWarm, v1.TierCold} {
		_, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: a.ID, Tier: tier})
		if !errors.Is(err, keys.ErrShredded) {
			t.Fatalf("rollback (tier %q) to a checkpoint whose key was shredded: %v", tier, err)
		}
	}
	if _, err := m.Fork(ctx, c.ID, v1.ForkRequest{}); !errors.Is(err, keys.ErrShredded) {
		t.Fatalf("fork of a checkpoint whose key was shredded: %v", err)
	}
	if r := run(t, m, sb.ID, "echo $X"); r.Stdout != "c\n" {
		t.Fatalf("the sandbox after the shred: X=%q", r.Stdout)
	}
}

// TestEncryptedRebuild: metadata rebuilt from the pool after the
// database was lost keeps what a sealed checkpoint needs (its data key
// and the key's tenant come from the signed manifest), and the
// checkpoint restores.
func TestEncryptedRebuild(t *testing.T) {
	m := openEncrypted(t)
	ctx := context.Background()
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "export X=sealed")
	a, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "export X=later")
	var cur *Manager
	closeLast(t, &cur)
	m = restartDaemon(t, m, func(db string) {
		if err := os.Remove(db); err != nil {
			t.Fatal(err)
		}
	})
	cur = m
	ck, err := m.lookupCheckpoint(a.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if ck.DataKey != a.DataKey || ck.DataKey == "" {
		t.Fatalf("rebuilt record's data key %q, want %q", ck.DataKey, a.DataKey)
	}
	if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: a.ID, Tier: v1.TierCold}); err != nil {
		t.Fatal(err)
	}
	if r := run(t, m, sb.ID, "echo $X"); r.Stdout != "sealed\n" {
		t.Fatalf("after the rebuild and rollback: X=%q", r.Stdout)
	}
}
