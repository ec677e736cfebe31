package bundle

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/image"
	"golang.org/x/sys/unix"
)

// Source is what Write bundles: one checkpoint.
type Source struct {
	// Header: Write sets Format and Created.
	Header Header
	// Manifest is the checkpoint's; Write flattens it (no parent) and
	// signs it with the host key. Its objects must be images
	// (images/NAME), in plaintext, with their plaintext hashes.
	Manifest ckstore.Manifest
	// Images is the directory holding the images in plaintext.
	Images string
	// FS is the root of the checkpoint's file tree.
	FS string
}

// Stats says what a bundle holds.
type Stats struct {
	Objects     int   `json:"objects"`
	ObjectBytes int64 `json:"object_bytes"`
	FSEntries   int64 `json:"fs_entries"`
	FSBytes     int64 `json:"fs_bytes"`
}

// Write writes the bundle of src to w, signed with k's host key. An
// object that is not of its manifest's size and hash fails the write:
// a bundle never carries what its manifest does not vouch for.
func Write(ctx context.Context, w io.Writer, k *ckstore.Keyring, src Source) (Stats, error) {
	var st Stats
	bw := bufio.NewWriterSize(w, 1<<20)
	tw := tar.NewWriter(bw)
	now := time.Now().UTC()
	hdr := src.Header
	hdr.Format, hdr.Created = Version, now
	hb, err := json.MarshalIndent(hdr, "", "  ")
	if err != nil {
		return st, err
	}
	mf := src.Manifest
	mf.Parent, mf.ParentDigest = "", ""
	k.Sign(&mf)
	if err := mf.Check(); err != nil {
		return st, fmt.Errorf("bundle: manifest: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	mb, err := mf.Encode()
	if err != nil {
		return st, err
	}
	if err := putFile(tw, headerName, hb, now); err != nil {
		return st, err
	}
	if err := putFile(tw, manifestName, mb, now); err != nil {
		return st, err
	}
	for _, o := range mf.Objects {
		if err := putObject(ctx, tw, src.Images, o, now); err != nil {
			return st, err
		}
		st.Objects++
		st.ObjectBytes += o.Size
	}
	th := newTreeHash()
	err = image.WalkTree(ctx, "bundle: file tree", src.FS, func(h *tar.Header, r io.Reader) error {
		if h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock {
			return nil // never carried: the importing host makes its own (see Read)
		}
		content := th.entry(h.Name, h.Linkname, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Size, h.ModTime, h.PAXRecords)
		if h.Name == "./" {
			h.Name = fsDir
		} else {
			h.Name = fsDir + h.Name
		}
		if h.Typeflag == tar.TypeLink {
			h.Linkname = fsDir + h.Linkname
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("bundle: %s: %w", h.Name, err)
		}
		if r != nil {
			if _, err := io.CopyN(io.MultiWriter(tw, content), r, h.Size); err != nil {
				return fmt.Errorf("bundle: %s: %w", h.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return st, err
	}
	st.FSEntries, st.FSBytes = th.entries, th.bytes
	seal := Seal{Format: Version, Header: sha(hb), Manifest: sha(mb), FS: th.sum(), FSEntries: th.entries, FSBytes: th.bytes}
	sig := k.SignBytes(seal.signedBytes())
	seal.Signature = &sig
	sb, err := json.MarshalIndent(seal, "", "  ")
	if err != nil {
		return st, err
	}
	if err := putFile(tw, sealName, sb, now); err != nil {
		return st, err
	}
	if err := tw.Close(); err != nil {
		return st, err
	}
	return st, bw.Flush()
}

func putFile(tw *tar.Writer, name string, b []byte, t time.Time) error {
	h := &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(b)), ModTime: t, Format: tar.FormatPAX}
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("bundle: %s: %w", name, err)
	}
	if _, err := tw.Write(b); err != nil {
		return fmt.Errorf("bundle: %s: %w", name, err)
	}
	return nil
}

// putObject copies image o from dir, checking its size and hash.
func putObject(ctx context.Context, tw *tar.Writer, dir string, o ckstore.Object, t time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	base, err := objectName(o)
	if err != nil {
		return fmt.Errorf("bundle: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	f, err := os.OpenFile(filepath.Join(dir, base), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("bundle: %s: %w", o.Path, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Size() != o.Size {
		return fmt.Errorf("bundle: %s: not a file of the manifest's size %d: %w", o.Path, o.Size, errdefs.ErrFailedPrecondition)
	}
	h := &tar.Header{Name: objectsDir + o.Path, Typeflag: tar.TypeReg, Mode: 0o600, Size: o.Size, ModTime: t, Format: tar.FormatPAX}
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("bundle: %s: %w", o.Path, err)
	}
	sum := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(tw, sum), f, o.Size); err != nil {
		return fmt.Errorf("bundle: %s: %w", o.Path, err)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != o.SHA256 {
		return fmt.Errorf("bundle: %s: content hash %.12s..., the manifest's %.12s... (corrupted): %w", o.Path, got, o.SHA256, errdefs.ErrFailedPrecondition)
	}
	return nil
}
