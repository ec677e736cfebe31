package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Dir is a Bucket of files beneath a directory: an object is a file at
// its key, written to a temporary name and renamed into place.
type Dir struct {
	root string
	counter
}

// NewDir returns the bucket of directory root, creating it.
func NewDir(root string) (*Dir, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	return &Dir{root: root}, nil
}

func (d *Dir) String() string { return "dir:" + d.root }

func (d *Dir) path(key string) (string, error) {
	if !ValidKey(key) {
		return "", badKey(key)
	}
	return filepath.Join(d.root, filepath.FromSlash(key)), nil
}

func (d *Dir) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d.requests.Add(1)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".put-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	n, err := io.Copy(f, countingReader{ReadCloser: io.NopCloser(io.LimitReader(r, size+1)), n: &d.sent})
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if n != size {
		return fmt.Errorf("put %s: %d bytes, want %d", key, n, size)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return os.Rename(f.Name(), p)
}

func (d *Dir) Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.requests.Add(1)
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if length < 0 {
		length = fi.Size() - off
	}
	if off < 0 || length < 0 || off+length > fi.Size() {
		f.Close()
		return nil, fmt.Errorf("get %s: bytes %d+%d beyond its %d", key, off, length, fi.Size())
	}
	return countingReader{ReadCloser: struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(f, off, length), f}, n: &d.received}, nil
}

func (d *Dir) Stat(ctx context.Context, key string) (int64, error) {
	p, err := d.path(key)
	if err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	d.requests.Add(1)
	fi, err := os.Stat(p)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func (d *Dir) List(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.requests.Add(1)
	var keys []string
	err := filepath.WalkDir(d.root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if e.Type().IsRegular() && !strings.Contains(e.Name(), ".tmp") {
			k, _ := filepath.Rel(d.root, p)
			k = filepath.ToSlash(k)
			if strings.HasPrefix(k, prefix) {
				keys = append(keys, k)
			}
		}
		return nil
	})
	slices.Sort(keys)
	return keys, err
}

func (d *Dir) Delete(ctx context.Context, key string) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d.requests.Add(1)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
