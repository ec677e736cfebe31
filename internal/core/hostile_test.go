package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
)

// TestForeignImagesValidated: a full checkpoint whose manifest another
// host's trusted key signed restores when its images are intact. The
// same checkpoint with a pages image cut by one page, its record and
// manifest given the cut file's hash and signed again by that key (so
// every hash and the signature pass), is refused by the image
// validation, naming the file, before CRIU runs: no restore work
// directory (where CRIU's restore.log goes) is made. A checkpoint this
// host signed is validated too: on a warm rollback, on `--tier cold`
// and by `molt checkpoint verify`.
func TestForeignImagesValidated(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	// Another host's key, trusted here (ROOT/keys/trusted/*.pub).
	fdir := t.TempDir()
	foreign, err := ckstore.LoadKeyring(fdir, nil)
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(m.cfg.Root, "keys")
	pub, err := os.ReadFile(filepath.Join(fdir, "host.pub"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(keys, "trusted", "other-host.pub"), pub, 0o644); err != nil {
		t.Fatal(err)
	}
	k, err := ckstore.LoadKeyring(keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.cks.SetKeyring(k)
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "echo before > /tmp/mark")
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "echo after > /tmp/mark")

	// What validation costs on a real checkpoint's images.
	var size int64
	for _, o := range mustCheckpoint(t, m, ck.ID).Objects {
		size += o.Size
	}
	const reps = 50
	t0 := time.Now()
	for range reps {
		if err := criu.ValidateImages(m.ckImages(ck.ID), criu.DefaultLimits()); err != nil {
			t.Fatalf("the intact checkpoint: %v", err)
		}
	}
	per := time.Since(t0) / reps
	t.Logf("criu.ValidateImages: %v per checkpoint of %d bytes of images (%.0f MB/s)", per, size, float64(size)/per.Seconds()/1e6)

	// Intact, signed by the other host: validated, and restored.
	resign(t, m, ck.ID, foreign)
	if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm}); err != nil {
		t.Fatalf("rollback to the intact checkpoint signed by a trusted key: %v", err)
	}
	if got := run(t, m, sb.ID, "cat /tmp/mark; echo later > /tmp/mark").Stdout; got != "before\n" {
		t.Fatalf("after the rollback the sandbox reads %q", got)
	}

	// The largest pages image, cut by one page.
	var pages ckstore.Object
	for _, o := range mustCheckpoint(t, m, ck.ID).Objects {
		if strings.HasPrefix(filepath.Base(o.Path), "pages-") && o.Size > pages.Size {
			pages = o
		}
	}
	if pages.Size < 2*4096 {
		t.Fatal("no pages image of two pages or more")
	}
	p := filepath.Join(m.ckDir(ck.ID), pages.Path)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p); err != nil { // it may share its blocks with other files
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b[:len(b)-4096], 0o600); err != nil {
		t.Fatal(err)
	}
	resign(t, m, ck.ID, foreign)
	restores := watchRestores(t, m)
	_, err = m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm})
	want := filepath.Base(pages.Path)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "checkpoint images") {
		t.Fatalf("rollback to the tampered checkpoint: %v; want a refusal of its images naming %s", err, want)
	}
	t.Logf("refused: %v", err)
	if n := restores(); n != "" {
		t.Fatalf("CRIU was started for the refused rollback: %s was made", n)
	}
	if got := run(t, m, sb.ID, "cat /tmp/mark").Stdout; got != "later\n" {
		t.Fatalf("after the refused rollback the sandbox reads %q", got)
	}

	// Signed by this host: validated all the same.
	resign(t, m, ck.ID, k)
	_, err = m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), want) {
		t.Fatalf("warm rollback to the tampered checkpoint this host signed: %v", err)
	}
	if _, err := m.VerifyCheckpoint(ck.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), want) {
		t.Fatalf("verify of the tampered checkpoint: %v", err)
	}
	_, err = m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierCold})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), want) {
		t.Fatalf("cold rollback to the tampered checkpoint: %v", err)
	}
	if n := restores(); n != "" {
		t.Fatalf("CRIU was started for the refused cold rollback: %s was made", n)
	}
}

func mustCheckpoint(t *testing.T, m *Manager, id string) checkpointRec {
	t.Helper()
	var rec checkpointRec
	if err := m.db.Get(meta.Checkpoints, id, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// watchRestores watches the directory where restores make their work
// directory (CRIU's restore.log goes there); the function returned
// names the first one made since (or since its last call), if any.
func watchRestores(t *testing.T, m *Manager) func() string {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, m.path("tmp"), unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	return func() string {
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if n <= 0 || err != nil {
				return ""
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
				if strings.HasPrefix(name, "restore-") {
					return name
				}
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}
}

// resign gives checkpoint id's record and manifest the objects of its
// images as they are now and signs the manifest with k.
func resign(t *testing.T, m *Manager, id string, k *ckstore.Keyring) {
	t.Helper()
	var rec checkpointRec
	if err := m.db.Get(meta.Checkpoints, id, &rec); err != nil {
		t.Fatal(err)
	}
	for i, o := range rec.Objects {
		b, err := os.ReadFile(filepath.Join(m.ckDir(id), o.Path))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		rec.Objects[i].Size, rec.Objects[i].SHA256 = int64(len(b)), hex.EncodeToString(sum[:])
	}
	if err := m.db.Put(meta.Checkpoints, id, rec); err != nil {
		t.Fatal(err)
	}
	mf, err := m.cks.ReadManifest(id)
	if err != nil {
		t.Fatal(err)
	}
	mf.Objects = rec.Objects
	k.Sign(&mf)
	b, err := mf.Encode()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(m.ckDir(id), ckstore.ManifestFile)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestSysVIPCImagesValidated: a sandbox holding System V shared memory,
// a semaphore set and a message queue with messages checkpoints into
// images the validation accepts (every restore runs it), and a warm
// rollback brings all three back, the queue's messages included. The
// same images with a message cut from the queue are refused.
func TestSysVIPCImagesValidated(t *testing.T) {
	m, sb := warmOnly(t)
	ctx := context.Background()
	if r := run(t, m, sb, `ipcmk -M 8192 >/dev/null && ipcmk -S 3 >/dev/null &&
perl -e '$id = msgget(0, 01000 | 0600); defined $id or die "msgget: $!"; for $t ("one", "second message") { msgsnd($id, pack("l! a*", 1, $t), 0) or die "msgsnd: $!" }'`); r.ExitCode != 0 {
		t.Fatalf("making the IPC objects: exit %d: %s", r.ExitCode, r.Stderr)
	}
	ck, err := m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := m.ckImages(ck.ID)
	for _, kind := range []string{"ipcns-shm-", "ipcns-sem-", "ipcns-msg-"} {
		if l, _ := filepath.Glob(filepath.Join(dir, kind+"*.img")); len(l) == 0 {
			t.Fatalf("no %s image: the test would prove nothing", kind)
		}
	}
	if err := criu.ValidateImages(dir, criu.DefaultLimits()); err != nil {
		t.Fatalf("the images of a sandbox with System V IPC: %v", err)
	}
	run(t, m, sb, "ipcrm --all")
	if _, err := m.RollbackWith(ctx, sb, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm}); err != nil {
		t.Fatal(err)
	}
	got := run(t, m, sb, `ipcs -m | grep -c '^0x'; ipcs -s | awk '$1 ~ /^0x/ {print $5}'; ipcs -q | awk '$1 ~ /^0x/ {print $5, $6}'`).Stdout
	if want := "1\n3\n" + strconv.Itoa(len("one")+len("second message")) + " 2\n"; got != want {
		t.Fatalf("after the rollback: %q, want %q", got, want)
	}

	// A copy of the images whose queue lost its last message.
	cut := t.TempDir()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(e.Name(), "ipcns-msg-") {
			b = b[:len(b)-20] // the last message's text (16 bytes) and the end of its entry
		}
		if err := os.WriteFile(filepath.Join(cut, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := criu.ValidateImages(cut, criu.DefaultLimits()); err == nil || !strings.Contains(err.Error(), "ipcns-msg-") {
		t.Fatalf("a message queue cut short: %v", err)
	}
}
