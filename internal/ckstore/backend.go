package ckstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/pagestore"
	"golang.org/x/sys/unix"
)

// Backend holds the stored bytes of checkpoint artifacts: per
// checkpoint, named objects (process images, page-hash files) and one
// manifest. IDs are single path components and object names are
// relative, clean paths (IsName, localName); a backend refuses others
// with errdefs.ErrInvalidArgument, whoever asks. A missing artifact,
// object or manifest is fs.ErrNotExist.
type Backend interface {
	// Create starts the artifact of checkpoint id: empty, without a
	// manifest. It fails if id has one already.
	Create(id string) error
	// Put stores the local file src as object name of checkpoint id and
	// reports its size, hash and page hashes. o.Index names content the
	// backend may share instead of writing it again; an error from
	// o.Yield ends the put, and nothing of the object remains. Put does
	// not replace an existing object.
	Put(ctx context.Context, id, name, src string, o PutOptions) (pagestore.Result, error)
	// Open opens object name of checkpoint id for reading.
	Open(id, name string) (io.ReadCloser, error)
	// Stat reports object name of checkpoint id as it is now.
	Stat(id, name string) (ObjectInfo, error)
	// Remove deletes object name of checkpoint id.
	Remove(id, name string) error
	// PutManifest writes the manifest of checkpoint id, replacing any.
	PutManifest(id string, b []byte) error
	// Manifest reads the manifest of checkpoint id.
	Manifest(id string) ([]byte, error)
	// List returns the IDs of every artifact, complete or not.
	List() ([]string, error)
	// Delete removes checkpoint id's artifact, whole; a missing one is
	// no error.
	Delete(id string) error
}

// PutOptions are the options of one Backend.Put.
type PutOptions struct {
	// Index holds pages of earlier objects (PageIndex) a put may share.
	Index *pagestore.Index
	// Yield, if set, is called with the bytes written every few hundred
	// pages and once at the end (a scheduler accounts and paces the I/O).
	Yield func(written int64) error
	// Sealer, if set, encrypts the object's pages before they are
	// stored (encrypt.go); the result carries their seals.
	Sealer pagestore.Sealer
}

// ObjectInfo describes one stored object as it is now.
type ObjectInfo struct {
	Size int64
	// Version identifies this state of the object: any write changes
	// it. Empty when the backend cannot tell, and then the object is
	// hashed on every verification.
	Version string
	// Changed is when the object last changed (its ctime), zero if the
	// backend cannot tell.
	Changed time.Time
}

// racyWindow is how recent a change must be for a stamp not to be
// trusted: the kernel stamps ctime from a clock that moves a tick (up to
// 10 ms) at a time, so a write in the same tick as the hashing leaves
// the stamp as it was. An object or manifest that changed this recently
// is not remembered as checked (as git treats "racily clean" entries).
const racyWindow = 50 * time.Millisecond

// stable reports whether fi changed long enough ago for its version to
// stand for its content.
func stable(fi ObjectInfo) bool {
	return fi.Changed.IsZero() || time.Since(fi.Changed) > racyWindow
}

// LocalBackend is a Backend whose artifacts are directories on this
// host: CRIU restores from them in place, and the checkpoint's files
// (a btrfs snapshot) live in them.
type LocalBackend interface {
	Backend
	// Dir is the directory of checkpoint id's artifact.
	Dir(id string) string
}

// Local is the backend of a directory of the pool (pool/checkpoints):
// one directory per checkpoint, objects as files in it, page content
// shared by reflink (internal/pagestore) on btrfs.
type Local struct{ root string }

// NewLocal returns the local backend of directory root, which exists.
func NewLocal(root string) *Local { return &Local{root: root} }

// Dir is the directory of checkpoint id.
func (l *Local) Dir(id string) string { return filepath.Join(l.root, id) }

func badID(id string) error {
	return fmt.Errorf("checkpoint ID %q is not a name: %w", id, errdefs.ErrInvalidArgument)
}

// path is the file of object name of checkpoint id.
func (l *Local) path(id, name string) (string, error) {
	if !IsName(id) {
		return "", badID(id)
	}
	if !localName(name) {
		return "", fmt.Errorf("object %q is not inside checkpoint %s: %w", name, id, errdefs.ErrInvalidArgument)
	}
	return filepath.Join(l.root, id, name), nil
}

func (l *Local) Create(id string) error {
	if !IsName(id) {
		return badID(id)
	}
	return os.Mkdir(l.Dir(id), 0o700)
}

func (l *Local) Put(ctx context.Context, id, name, src string, o PutOptions) (pagestore.Result, error) {
	dst, err := l.path(id, name)
	if err != nil {
		return pagestore.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return pagestore.Result{}, err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return pagestore.Result{}, err
	}
	x := o.Index
	if x == nil {
		x = pagestore.NewIndex()
	}
	return pagestore.StoreSealed(src, dst, x, o.Yield, o.Sealer)
}

// Open opens the object beneath the checkpoint's directory, following
// no symbolic link: what the pool holds is never trusted to stay where
// it was put.
func (l *Local) Open(id, name string) (io.ReadCloser, error) {
	if _, err := l.path(id, name); err != nil {
		return nil, err
	}
	dir, err := unix.Open(l.Dir(id), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: l.Dir(id), Err: err}
	}
	defer unix.Close(dir)
	fd, err := unix.Openat2(dir, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(l.Dir(id), name), Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(l.Dir(id), name)), nil
}

// Stat stamps the object by inode, size and ctime: any write through
// the filesystem moves the ctime, and btrfs checksums what the disk
// returns.
func (l *Local) Stat(id, name string) (ObjectInfo, error) {
	p, err := l.path(id, name)
	if err != nil {
		return ObjectInfo{}, err
	}
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return ObjectInfo{}, &os.PathError{Op: "stat", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return ObjectInfo{Size: st.Size}, nil // not a file: never trusted
	}
	v := strconv.AppendUint(nil, st.Ino, 10)
	v = append(v, ':')
	v = strconv.AppendInt(v, st.Size, 10)
	v = append(v, ':')
	v = strconv.AppendInt(v, st.Ctim.Sec, 10)
	v = append(v, '.')
	v = strconv.AppendInt(v, st.Ctim.Nsec, 10)
	return ObjectInfo{Size: st.Size, Version: string(v), Changed: time.Unix(st.Ctim.Sec, st.Ctim.Nsec)}, nil
}

func (l *Local) Remove(id, name string) error {
	p, err := l.path(id, name)
	if err != nil {
		return err
	}
	return os.Remove(p)
}

// PutManifest writes the manifest in place. It is not fsynced: the
// engine makes it durable with the rest of the checkpoint (a snapshot's
// or a syncfs's commit of the pool).
func (l *Local) PutManifest(id string, b []byte) error {
	p, err := l.path(id, ManifestFile)
	if err != nil {
		return err
	}
	return os.WriteFile(p, b, 0o600)
}

func (l *Local) Manifest(id string) ([]byte, error) {
	p, err := l.path(id, ManifestFile)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(p)
}

func (l *Local) List() ([]string, error) {
	ents, err := os.ReadDir(l.root)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && IsName(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// Delete removes the checkpoint's directory, its subvolumes included.
func (l *Local) Delete(id string) error {
	if !IsName(id) {
		return badID(id)
	}
	err := fsnap.RemoveTree(l.Dir(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
