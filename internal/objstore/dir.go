package objstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
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

// A Dir's versions are the SHA-256 of the content. PutIf's check and
// rename run under an exclusive flock(2) of the object's directory, so
// that writers on every host that shares the directory take turns.

func (d *Dir) ReadVersion(ctx context.Context, key string, max int64) ([]byte, string, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, "", err
	}
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	d.requests.Add(1)
	b, err := readFileMax(p, max)
	if err != nil {
		return nil, "", fmt.Errorf("get %s: %w", key, err)
	}
	d.received.Add(int64(len(b)))
	return b, contentVersion(b), nil
}

func (d *Dir) PutIf(ctx context.Context, key string, data []byte, version string) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := conditional(ctx, key, data); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	dir, err := os.Open(filepath.Dir(p))
	if err != nil {
		return err
	}
	defer dir.Close()
	if err := flockCtx(ctx, int(dir.Fd())); err != nil {
		return fmt.Errorf("put %s: lock: %w", key, err)
	}
	defer unix.Flock(int(dir.Fd()), unix.LOCK_UN)
	cur, err := readFileMax(p, MaxConditional)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if version != "" {
			return fmt.Errorf("put %s: %w (it is gone)", key, ErrChanged)
		}
	case err != nil:
		return fmt.Errorf("put %s: %w", key, err)
	case version == "" || contentVersion(cur) != version:
		return fmt.Errorf("put %s: %w", key, ErrChanged)
	}
	return d.Put(ctx, key, bytes.NewReader(data), int64(len(data)))
}

// flockCtx takes an exclusive flock of fd, trying until ctx ends.
func flockCtx(ctx context.Context, fd int) error {
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

func contentVersion(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// readFileMax reads file p, refusing one of more than max bytes.
func readFileMax(p string, max int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("more than the %d bytes allowed: %w", max, errdefs.ErrFailedPrecondition)
	}
	return b, nil
}
