// Package atomicfile writes small files that must be whole and durable:
// keys, key files, anchors. A reader sees the old content or the new,
// never part of it, and a crash after Write returns loses neither.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes b to path with mode: into path.tmp, synced, renamed over
// path, and the directory synced.
func Write(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes dir's entries (a rename, a removal) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
