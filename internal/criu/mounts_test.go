package criu

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/mnt"
	"google.golang.org/protobuf/proto"

	"github.com/molt-sh/molt/internal/errdefs"
)

// sandboxMounts is a sandbox's mount table as CRIU records it: the root
// (a btrfs subvolume), proc with a /dev/null bind over /proc/kcore,
// devpts, and a mask tmpfs.
func sandboxMounts() []*mnt.MntEntry {
	e := func(id, parent, dev uint32, root, mp string) *mnt.MntEntry {
		return &mnt.MntEntry{Fstype: proto.Uint32(1), MntId: proto.Uint32(id), RootDev: proto.Uint32(dev),
			ParentMntId: proto.Uint32(parent), Flags: proto.Uint32(0), Root: proto.String(root),
			Mountpoint: proto.String(mp), Source: proto.String("x"), Options: proto.String("")}
	}
	return []*mnt.MntEntry{
		e(10, 1, 40, "/sandboxes/a/root", "./"),
		e(11, 10, 5, "/", "./proc"),
		e(12, 11, 40, "/sandboxes/a/root/dev/null", "./proc/kcore"),
		e(13, 10, 6, "/", "./dev/pts"),
		e(14, 11, 7, "/", "./proc/acpi"),
		e(15, 10, 40, "/sandboxes/a/root/var/empty", "./mnt/new/dir"),
	}
}

func writeMounts(t *testing.T, dir string, ents []*mnt.MntEntry) {
	t.Helper()
	msgs := make([]proto.Message, len(ents))
	for i, e := range ents {
		msgs[i] = e
	}
	_ = os.Remove(filepath.Join(dir, "mountpoints-12.img"))
	if err := writeImage(filepath.Join(dir, "mountpoints-12.img"), "MNTS", msgs); err != nil {
		t.Fatal(err)
	}
}

// TestCheckMountsRefusesSymlinks: a mountpoint or a bind mount's source
// that the sandbox replaced by a symlink (to a host path, or anywhere)
// fails the check before CRIU runs; the untouched tree passes.
func TestCheckMountsRefusesSymlinks(t *testing.T) {
	host := t.TempDir() // stands for a host directory and file
	if err := os.WriteFile(filepath.Join(host, "secret"), []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	images := t.TempDir()
	writeMounts(t, images, sandboxMounts())
	fresh := func() string {
		root := t.TempDir()
		for _, d := range []string{"proc", "dev/pts", "var/empty", "mnt"} {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(root, "dev/null"), nil, 0o666); err != nil {
			t.Fatal(err)
		}
		return root
	}
	if err := CheckMounts(images, fresh()); err != nil {
		t.Fatalf("untouched root: %v", err)
	}
	for _, tc := range []struct {
		name, path, target, want string
	}{
		{"mountpoint", "dev/pts", host, `"/dev/pts"`},
		{"mountpoint relative", "proc", "../../../../../../../" + host, `"/proc"`},
		{"bind source", "dev/null", filepath.Join(host, "secret"), `"/dev/null"`},
		{"parent of a bind source", "var", host, `"/var/empty"`},
		{"parent of a new mountpoint", "mnt", host, `"/mnt/new/dir"`},
		{"magic link", "dev/pts", "/proc/self/root" + host, `"/dev/pts"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fresh()
			p := filepath.Join(root, tc.path)
			if err := os.RemoveAll(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(tc.target, p); err != nil {
				t.Fatal(err)
			}
			err := CheckMounts(images, root)
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckMounts = %v; want a refusal naming %s", err, tc.want)
			}
		})
	}
	// A bind mount from the root's filesystem but outside the root.
	ents := sandboxMounts()
	ents[2].Root = proto.String("/sandboxes/b/root/dev/null")
	writeMounts(t, images, ents)
	if err := CheckMounts(images, fresh()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("bind from another sandbox: %v", err)
	}
}
