package ckstore

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/pagestore"
)

// Names inside one checkpoint's directory.
const (
	// ImagesDir holds CRIU's images of a full checkpoint: the objects
	// images/NAME.
	ImagesDir = "images"
	// PageHashDir holds, per multi-page image, the hashes of its pages
	// (objects pagehash/NAME), for the page indexes of later checkpoints.
	PageHashDir = "pagehash"
	// FSDir is the read-only snapshot of the sandbox's files.
	FSDir = "fs"
	// FSNextDir is a writable copy of a full checkpoint's files,
	// snapshotted from FSDir before the commit: the first rollback to
	// the checkpoint renames it into place instead of snapshotting on
	// its critical path.
	FSNextDir = "fs.next"
)

// Store is the checkpoint artifacts of one pool, over a Backend. It
// owns the stamp cache of quick verification.
type Store struct {
	b     Backend
	local LocalBackend // b, when its artifacts are directories here
	// keys signs the manifests written and checks those read (nil:
	// neither; see sign.go).
	keys *Keyring

	stampsMu sync.Mutex
	// +checklocks:stampsMu
	stamps map[string]string // id/object -> version hashed by this process
}

// New returns the store of backend b.
func New(b Backend) *Store {
	s := &Store{b: b, stamps: map[string]string{}}
	s.local, _ = b.(LocalBackend)
	return s
}

// SetKeyring makes the store sign every manifest it writes with k's
// host key and check the signature of every manifest a restore reads.
// Call it before the store is used.
func (s *Store) SetKeyring(k *Keyring) { s.keys = k }

// Keyring is the store's keyring (nil if none).
func (s *Store) Keyring() *Keyring { return s.keys }

// Backend is the store's backend.
func (s *Store) Backend() Backend { return s.b }

// Dir is the directory of checkpoint id ("" if the backend keeps no
// directories here).
func (s *Store) Dir(id string) string {
	if s.local == nil {
		return ""
	}
	return s.local.Dir(id)
}

// FS is the read-only snapshot of checkpoint id's files.
func (s *Store) FS(id string) string { return s.sub(id, FSDir) }

// FSNext is the writable copy of checkpoint id's files (see FSNextDir).
func (s *Store) FSNext(id string) string { return s.sub(id, FSNextDir) }

// Images is the directory CRIU dumps and restores checkpoint id's
// processes from.
func (s *Store) Images(id string) string { return s.sub(id, ImagesDir) }

func (s *Store) sub(id, name string) string {
	if s.local == nil {
		return ""
	}
	return filepath.Join(s.local.Dir(id), name)
}

// Delete removes checkpoint id's artifact and forgets its stamps.
func (s *Store) Delete(id string) error {
	err := s.b.Delete(id)
	s.stampsMu.Lock()
	for k := range s.stamps {
		if strings.HasPrefix(k, id+"/") {
			delete(s.stamps, k)
		}
	}
	s.stampsMu.Unlock()
	return err
}

// List returns the IDs of the complete artifacts: those whose manifest
// was written (Writer.Commit), whatever it says.
func (s *Store) List() ([]string, error) {
	ids, err := s.b.List()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, id := range ids {
		if _, err := s.ReadManifest(id); err == nil {
			out = append(out, id)
		}
	}
	return out, nil
}

// ReadManifest reads and checks checkpoint id's manifest. A manifest is
// read as hostile input: it names files to restore.
func (s *Store) ReadManifest(id string) (Manifest, error) {
	b, err := s.b.Manifest(id)
	if err != nil {
		return Manifest{}, err
	}
	return DecodeManifest(b)
}

// Complete reads checkpoint id's manifest from its artifact, or says why
// the artifact is not a checkpoint that can be listed: the manifest is
// missing or unreadable, or names another checkpoint, or the files or
// objects it lists are missing.
func (s *Store) Complete(id string) (Manifest, string) {
	mf, err := s.ReadManifest(id)
	if err != nil {
		return Manifest{}, "no readable manifest: " + err.Error()
	}
	if mf.ID != id || !IsName(mf.Sandbox) {
		return Manifest{}, fmt.Sprintf("manifest names checkpoint %q of sandbox %q", mf.ID, mf.Sandbox)
	}
	if s.local != nil {
		if sub, _ := fsnap.IsSubvolume(s.FS(id)); !sub {
			return Manifest{}, "no file snapshot"
		}
	}
	for _, o := range mf.Objects {
		if fi, err := s.b.Stat(id, o.Path); err != nil || fi.Size != o.Size {
			return Manifest{}, fmt.Sprintf("object %s missing or of another size", o.Path)
		}
	}
	if mf.Kind == "full" && len(mf.Objects) == 0 {
		return Manifest{}, "full checkpoint without process images"
	}
	return mf, ""
}

// Reader reads one checkpoint's artifact.
type Reader struct {
	s  *Store
	id string
}

// Reader returns the reader of checkpoint id.
func (s *Store) Reader(id string) Reader { return Reader{s: s, id: id} }

// Verify is Reader(id).Verify.
func (s *Store) Verify(id string, objs []Object, thorough bool) error {
	return s.Reader(id).Verify(objs, thorough)
}

// Verify checks every object of objs (the checkpoint's record lists
// them: the manifest on disk is not trusted for this): present, same
// size, same hash. Nothing is restored from a checkpoint that fails.
// Unless thorough, an object this store hashed before and that has not
// changed since (same version, see ObjectInfo) is not hashed again;
// `molt checkpoint verify` is thorough.
func (r Reader) Verify(objs []Object, thorough bool) error {
	s, id := r.s, r.id
	if s.local != nil {
		if _, err := os.Stat(s.FS(id)); err != nil {
			return fmt.Errorf("checkpoint %s: file snapshot missing: %w", id, errdefs.ErrFailedPrecondition)
		}
	}
	var bad []string
	var good []Object
	for _, o := range objs {
		if !thorough {
			s.stampsMu.Lock()
			known, ok := s.stamps[id+"/"+o.Path]
			s.stampsMu.Unlock()
			if fi, err := s.b.Stat(id, o.Path); ok && err == nil && fi.Version != "" && fi.Version == known && fi.Size == o.Size {
				continue
			}
		}
		sum, n, err := r.hash(o.Path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			bad = append(bad, o.Path+": missing")
		case err != nil:
			bad = append(bad, o.Path+": "+err.Error())
		case n != o.Size:
			bad = append(bad, fmt.Sprintf("%s: %d bytes, want %d (truncated or extended)", o.Path, n, o.Size))
		case sum != o.SHA256:
			bad = append(bad, fmt.Sprintf("%s: content hash %s..., want %.12s... (corrupted)", o.Path, sum[:12], o.SHA256))
		default:
			good = append(good, o)
		}
	}
	s.remember(id, good, true)
	if len(bad) > 0 {
		if len(bad) > 5 {
			bad = append(bad[:5], fmt.Sprintf("and %d more", len(bad)-5))
		}
		return fmt.Errorf("checkpoint %s failed verification: %v: %w", id, bad, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// hash returns the SHA-256 and size of object name.
func (r Reader) hash(name string) (string, int64, error) {
	f, err := r.s.b.Open(r.id, name)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// Restore is where a restore reads a checkpoint from.
type Restore struct {
	// Images is the directory of CRIU's images.
	Images string
	// FS is the read-only snapshot of the files.
	FS string
}

// Open checks that the artifact is complete (its manifest, of this
// checkpoint, was written), verifies the objects (see Verify) and
// returns the paths CRIU restores from. Only a local backend restores in
// place.
func (r Reader) Open(objs []Object, thorough bool) (Restore, error) {
	if r.s.local == nil {
		return Restore{}, fmt.Errorf("checkpoint %s: restoring from a backend without local directories: %w", r.id, errdefs.ErrNotSupported)
	}
	if err := r.checkManifest(objs, thorough); err != nil {
		return Restore{}, err
	}
	if err := r.Verify(objs, thorough); err != nil {
		return Restore{}, err
	}
	return Restore{Images: r.s.Images(r.id), FS: r.s.FS(r.id)}, nil
}

// CheckManifest checks the artifact's manifest as Open does, thoroughly,
// without verifying the objects: for an artifact whose objects are
// checked otherwise as they arrive.
func (r Reader) CheckManifest(objs []Object) error { return r.checkManifest(objs, true) }

// checkManifest checks that the artifact's manifest is there and is its
// own, and, with a keyring, that a signed manifest's signature verifies
// with a trusted key and that it lists the objects the engine's record
// lists (objs). A manifest without a signature is one written before
// manifests were signed: the engine's record, which restores check the
// objects against, vouches for it. Unless thorough, a manifest read and
// found so before that has not changed since (same version) is not read
// again: a rollback's hot tier opens the artifact on its critical path.
func (r Reader) checkManifest(objs []Object, thorough bool) error {
	key := r.id + "/\x00" + ManifestFile // no object's path
	fi, serr := r.s.b.Stat(r.id, ManifestFile)
	if !thorough && serr == nil && fi.Version != "" {
		r.s.stampsMu.Lock()
		known, ok := r.s.stamps[key]
		r.s.stampsMu.Unlock()
		if ok && known == fi.Version {
			return nil
		}
	}
	mf, err := r.s.ReadManifest(r.id)
	if err != nil {
		return fmt.Errorf("checkpoint %s is not complete: %w", r.id, err)
	}
	if mf.ID != r.id {
		return fmt.Errorf("checkpoint %s: its manifest names %q: %w", r.id, mf.ID, errdefs.ErrFailedPrecondition)
	}
	if k := r.s.keys; k != nil && mf.Signature != nil {
		if err := k.Check(mf); err != nil {
			return err
		}
		if !sameObjects(mf.Objects, objs) {
			return fmt.Errorf("checkpoint %s: its signed manifest and the engine's record list different objects: %w", r.id, errdefs.ErrFailedPrecondition)
		}
	}
	if serr == nil && fi.Version != "" && stable(fi) {
		r.s.stampsMu.Lock()
		r.s.stamps[key] = fi.Version
		r.s.stampsMu.Unlock()
	}
	return nil
}

// sameObjects reports whether a and b list the same objects (in any
// order).
func sameObjects(a, b []Object) bool {
	if len(a) != len(b) {
		return false
	}
	m := make(map[Object]int, len(a))
	for _, o := range a {
		m[o]++
	}
	for _, o := range b {
		if m[o] == 0 {
			return false
		}
		m[o]--
	}
	return true
}

// Remember records that the objects of checkpoint id were hashed (as
// written, or verified) in their current state.
func (s *Store) Remember(id string, objs []Object) { s.remember(id, objs, false) }

// remember is Remember; hashed says the objects were read back (not
// just written by this process), and then one changed within the racy
// window is not remembered: a write in the same clock tick as the
// hashing would leave its stamp unchanged.
func (s *Store) remember(id string, objs []Object, hashed bool) {
	for _, o := range objs {
		fi, err := s.b.Stat(id, o.Path)
		if err != nil || fi.Version == "" || (hashed && !stable(fi)) {
			continue
		}
		s.stampsMu.Lock()
		s.stamps[id+"/"+o.Path] = fi.Version
		s.stampsMu.Unlock()
	}
}

// LineageDepth bounds how many earlier full checkpoints of a sandbox's
// lineage a new checkpoint's pages are matched against.
const LineageDepth = 4

// Ref is what the page index needs of one checkpoint of a lineage.
type Ref struct {
	ID, Parent string
	Full       bool
	Objects    []Object
}

// PageIndex indexes the pages of the nearest full checkpoints up the
// lineage of a sandbox whose head is head (parents, then the checkpoint
// a fork came from, and so on), as lookup finds them. Only a local
// backend shares pages; another gets an empty index.
func (s *Store) PageIndex(head string, lookup func(id string) (Ref, bool)) *pagestore.Index {
	x := pagestore.NewIndex()
	if s.local == nil {
		return x
	}
	found := 0
	seen := map[string]bool{}
	for id := head; id != "" && !seen[id] && found < LineageDepth; {
		seen[id] = true
		c, ok := lookup(id)
		if !ok {
			break
		}
		if c.Full {
			// What cannot be read only costs sharing.
			dir := s.local.Dir(c.ID)
			hashes, _ := filepath.Glob(filepath.Join(dir, PageHashDir, "*"))
			for _, h := range hashes {
				_ = x.AddHashFile(filepath.Join(dir, ImagesDir, filepath.Base(h)), h)
				_ = x.AddFilePages(h) // hash files change little too
			}
			seals, _ := filepath.Glob(filepath.Join(dir, SealDir, "*"))
			for _, f := range seals {
				_ = x.AddFilePages(f) // as do an encrypted image's seals
			}
			for _, o := range c.Objects {
				var sum [pagestore.HashSize]byte
				if b, err := hex.DecodeString(o.SHA256); err == nil && len(b) == len(sum) && o.Size < pagestore.PageSize {
					copy(sum[:], b)
					x.AddSmall(filepath.Join(dir, o.Path), sum)
				}
			}
			found++
		}
		id = c.Parent
	}
	return x
}
