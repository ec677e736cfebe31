package fsnap

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// RemoveTree deletes path, which may be a subvolume, a directory holding
// subvolumes, or missing.
func RemoveTree(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		if sub, _ := IsSubvolume(path); sub {
			if err := DeleteSubvolume(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			return nil
		}
		ents, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := RemoveTree(filepath.Join(path, e.Name())); err != nil {
				return err
			}
		}
	}
	return os.Remove(path)
}
