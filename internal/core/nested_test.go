package core

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"golang.org/x/sys/unix"
)

// nest makes dir (a path inside a sandbox's root, on the host) a
// subvolume holding a file and another subvolume, as an image, a restore
// or a sandbox with the ioctl allowed can leave in a root.
func nest(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fsnap.CreateSubvolume(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), []byte("nested\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fsnap.CreateSubvolume(filepath.Join(dir, "inner")); err != nil {
		t.Fatal(err)
	}
}

// TestNestedSubvolumes: a sandbox whose root holds nested subvolumes is
// refused a filesystem (and full) checkpoint with an error naming them,
// never stored with empty directories in their place; rollback away from
// such a root and removing the sandbox delete them; a restart finds
// debris holding them (and debris it cannot delete at all), sets it
// aside and starts.
func TestNestedSubvolumes(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "echo base > /base")
	good, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS, Label: "good"})
	if err != nil {
		t.Fatal(err)
	}

	nest(t, filepath.Join(m.sbRoot(sb.ID), "srv", "vol"))
	if got := run(t, m, sb.ID, "cat /srv/vol/data").Stdout; got != "nested\n" {
		t.Fatalf("nested file seen from the sandbox: %q", got)
	}
	kinds := []string{v1.KindFS}
	if _, err := m.criuReady(ctx); err == nil {
		kinds = append(kinds, v1.KindFull)
	} else {
		t.Logf("full checkpoints not checked: %v", err)
	}
	for _, kind := range kinds {
		ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: kind, Wait: true})
		if err == nil {
			data, rerr := os.ReadFile(filepath.Join(m.ckFS(ck.ID), "srv", "vol", "data"))
			t.Fatalf("%s checkpoint of a root with a nested subvolume taken (its copy of the nested file: %q, %v), want refused", kind, data, rerr)
		}
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), `"/srv/vol"`) {
			t.Fatalf("%s checkpoint of a root with a nested subvolume: %v, want failed precondition naming /srv/vol", kind, err)
		}
		t.Logf("%s checkpoint refused: %v", kind, err)
	}
	if cks, _ := m.Checkpoints(sb.ID); len(cks) != 1 {
		t.Fatalf("checkpoints after the refusals: %+v", cks)
	}
	if e := entries(t, m.path("checkpoints")); len(e) != 1 || e[0] != good.ID {
		t.Fatalf("checkpoint directories after the refusals: %v", e)
	}
	if got := run(t, m, sb.ID, "cat /base /srv/vol/data").Stdout; got != "base\nnested\n" {
		t.Fatalf("sandbox after the refusals: %q", got)
	}

	// Rollback replaces the root: the old one goes, nested subvolumes
	// and all.
	if _, err := m.Rollback(ctx, sb.ID, good.ID); err != nil {
		t.Fatalf("rollback away from a root with nested subvolumes: %v", err)
	}
	if e := entries(t, m.sbDir(sb.ID)); slices.ContainsFunc(e, func(n string) bool { return strings.HasPrefix(n, "root.") }) {
		t.Fatalf("after the rollback the sandbox's directory holds %v", e)
	}
	if got := run(t, m, sb.ID, "cat /base; test -e /srv/vol && echo left").Stdout; got != "base\n" {
		t.Fatalf("sandbox after the rollback: %q", got)
	}

	// rm deletes a root holding nested subvolumes, and a checkpoint.
	nest(t, filepath.Join(m.sbRoot(sb.ID), "srv", "again"))
	if err := m.Remove(ctx, sb.ID); err != nil {
		t.Fatalf("remove a sandbox with nested subvolumes: %v", err)
	}
	if e := entries(t, m.path("sandboxes")); len(e) != 0 {
		t.Fatalf("sandbox directories after rm: %v", e)
	}
	if e := entries(t, m.path("checkpoints")); len(e) != 0 {
		t.Fatalf("checkpoint directories after rm: %v", e)
	}

	// Debris for the next start: staging holding nested subvolumes (a
	// crash in the middle of making a root), and a staging directory
	// nothing can delete (an immutable file).
	nest(t, m.path("tmp", "crashed", "root"))
	nest(t, filepath.Join(m.path("tmp", "crashed", "root"), "deep"))
	stuck := m.path("tmp", "stuck")
	if err := os.MkdirAll(stuck, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(stuck, "immutable"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, fsImmutable); err != nil {
		f.Close()
		t.Fatal(err)
	}
	f.Close()
	t.Cleanup(func() {
		// So that the pool's files can go (they are in a loop image,
		// but clear it in case the pool is a plain directory).
		matches, _ := filepath.Glob(m.path("quarantine", "*", "immutable"))
		matches = append(matches, filepath.Join(stuck, "immutable"))
		for _, p := range matches {
			if f, err := os.Open(p); err == nil {
				_ = unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, 0)
				f.Close()
			}
		}
	})

	m.Close()
	var cur *Manager
	closeLast(t, &cur)
	cur, err = Open(ctx, m.cfg)
	if err != nil {
		t.Fatalf("restart with nested subvolumes and undeletable debris in staging: %v", err)
	}
	if e := entries(t, cur.path("tmp")); len(e) != 0 {
		t.Fatalf("staging after the restart: %v", e)
	}
	q := entries(t, cur.path("quarantine"))
	if len(q) != 1 || !strings.HasSuffix(q[0], "staging-stuck") {
		t.Fatalf("quarantine after the restart: %v, want the undeletable staging only", q)
	}
	sb2, err := cur.Create(ctx, v1.SandboxCreateRequest{Image: testImage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cur.Checkpoint(ctx, sb2.ID, v1.CheckpointRequest{Kind: v1.KindFS}); err != nil {
		t.Fatalf("checkpoint after the restart: %v", err)
	}
}

// fsImmutable is FS_IMMUTABLE_FL from <linux/fs.h>.
const fsImmutable = 0x10
