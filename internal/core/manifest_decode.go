package core

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
)

// manifestFormat is the format writeManifest writes; a later molt may add
// fields to it, and raises it when an older molt must not read it.
const manifestFormat = 1

// decodeManifest reads a checkpoint's manifest.json. A manifest is read
// back from disk, where anything may have happened to it, and its fields
// name directories and files: what it returns is one JSON value of a
// known format whose IDs are single path components, whose kind is known
// and whose objects lie inside the checkpoint's directory, each with a
// SHA-256 and a size.
func decodeManifest(b []byte) (manifest, error) {
	var mf manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&mf); err != nil {
		return manifest{}, fmt.Errorf("manifest: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return manifest{}, fmt.Errorf("manifest: data after the manifest: %w", errdefs.ErrInvalidArgument)
	}
	if err := mf.check(); err != nil {
		return manifest{}, fmt.Errorf("manifest %q: %w: %w", mf.ID, err, errdefs.ErrInvalidArgument)
	}
	return mf, nil
}

func (mf manifest) check() error {
	if mf.Format != manifestFormat {
		return fmt.Errorf("format %d, this molt reads %d", mf.Format, manifestFormat)
	}
	if !nameRE.MatchString(mf.ID) || !nameRE.MatchString(mf.Sandbox) {
		return errors.New("checkpoint or sandbox ID is not a name")
	}
	if mf.Parent != "" && !nameRE.MatchString(mf.Parent) {
		return errors.New("parent ID is not a name")
	}
	if mf.Kind != v1.KindFS && mf.Kind != v1.KindFull {
		return fmt.Errorf("kind %q", mf.Kind)
	}
	if mf.Kind == v1.KindFS && len(mf.Objects) > 0 {
		return errors.New("an fs checkpoint with stored objects")
	}
	if r := mf.IDs; r.Enabled() && (r.Size != UserNSSize || r.Base == 0 || uint64(r.Base)+uint64(r.Size) > 1<<32-1) {
		return fmt.Errorf("user namespace ids %s: want a block of %d unprivileged ids", r, UserNSSize)
	}
	for _, o := range mf.Objects {
		if !filepath.IsLocal(o.Path) || filepath.Clean(o.Path) != o.Path {
			return fmt.Errorf("object path %q is not inside the checkpoint", o.Path)
		}
		if o.Size < 0 {
			return fmt.Errorf("object %s: size %d", o.Path, o.Size)
		}
		if s, err := hex.DecodeString(o.SHA256); err != nil || len(s) != 32 || hex.EncodeToString(s) != o.SHA256 {
			return fmt.Errorf("object %s: sha256 %q is not 64 lowercase hex digits", o.Path, o.SHA256)
		}
	}
	return nil
}
