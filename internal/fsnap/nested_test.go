package fsnap_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/molt-sh/molt/internal/fsnap"
)

// A subvolume holding nested subvolumes (in plain directories, nested
// again, one read-only) is deleted whole; a symlink in it to a subvolume
// outside is not followed.
func TestDeleteNestedDeep(t *testing.T) {
	dir := btrfsDir(t)
	top := filepath.Join(dir, "top")
	outside := filepath.Join(dir, "outside")
	for _, p := range []string{top, outside} {
		if err := fsnap.CreateSubvolume(p); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(outside, "keep"), "keep")
	write(t, filepath.Join(top, "a", "b", "file"), "x")
	nested := filepath.Join(top, "a", "b", "sub")
	deeper := filepath.Join(nested, "deeper")
	for _, p := range []string{nested, filepath.Join(top, "sub2"), deeper} {
		if err := fsnap.CreateSubvolume(p); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(deeper, "f"), "y")
	if err := fsnap.Snapshot(deeper, filepath.Join(nested, "ro"), true); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(top, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(nested, "link")); err != nil {
		t.Fatal(err)
	}

	got, err := fsnap.NestedSubvolumes(top)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a/b/sub", "sub2"}; !slices.Equal(got, want) {
		t.Errorf("NestedSubvolumes = %q, want %q", got, want)
	}
	if got, err := fsnap.NestedSubvolumes(outside); err != nil || len(got) != 0 {
		t.Errorf("NestedSubvolumes(outside) = %q, %v, want none", got, err)
	}

	if err := fsnap.DeleteSubvolume(top); err != nil {
		t.Fatalf("DeleteSubvolume with nested subvolumes: %v", err)
	}
	if _, err := os.Lstat(top); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s still there: %v", top, err)
	}
	wantContent(t, filepath.Join(outside, "keep"), "keep")
	if sub, err := fsnap.IsSubvolume(outside); err != nil || !sub {
		t.Errorf("outside subvolume gone: %v %v", sub, err)
	}
}
