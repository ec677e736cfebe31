package ckstore

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/sandbox"
)

// ManifestFile is the name of a checkpoint's manifest in its directory.
const ManifestFile = "manifest.json"

// Format is the manifest format this package writes; a later molt may
// add fields to it, and raises it when an older molt must not read it.
const Format = 1

// UserNSSize is the size of the block of host ids a sandbox's user
// namespace maps: every 16-bit id, as a Debian image's users and groups
// expect. A manifest naming another block is refused.
const UserNSSize = 1 << 16

// nameRE is what a checkpoint or sandbox ID must match: one path
// component (the engine's rule for names).
var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// IsName reports whether id can name a checkpoint or sandbox: a single
// path component.
func IsName(id string) bool { return nameRE.MatchString(id) }

// Object is one stored file of a checkpoint, with its size and hash, as
// the manifest records it. Paths are relative to the checkpoint
// directory.
type Object struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Manifest is written next to a checkpoint's files. It is
// self-describing and holds no host paths, so a checkpoint can move to
// another host later.
type Manifest struct {
	Format  int       `json:"format"`
	ID      string    `json:"id"`
	Sandbox string    `json:"sandbox"`
	Parent  string    `json:"parent,omitempty"`
	Kind    string    `json:"kind"`
	Label   string    `json:"label,omitempty"`
	Image   string    `json:"image"`
	Created time.Time `json:"created"`
	Molt    string    `json:"molt"`
	Kernel  string    `json:"kernel"`
	Arch    string    `json:"arch"`
	CRIU    string    `json:"criu,omitempty"`
	// ExternalNet: the images leave the network namespace out; a restore
	// runs CRIU in a fresh loopback-only one, which the tree joins.
	// ExternalUTS and ExternalIPC: the same for the UTS namespace (named
	// as the sandbox) and the IPC namespace (empty).
	ExternalNet bool `json:"external_net,omitempty"`
	ExternalUTS bool `json:"external_uts,omitempty"`
	ExternalIPC bool `json:"external_ipc,omitempty"`
	// IDs: the block of host ids the images' user namespace maps.
	IDs     sandbox.IDRange `json:"ids,omitzero"`
	Objects []Object        `json:"objects,omitempty"`
	// LedgerHead: the sandbox's effect ledger head when the checkpoint
	// was taken (a rollback rewinds the ledger there).
	LedgerHead string `json:"ledger_head,omitempty"`
	// EgressAddr: the sandbox's egress address when its processes were
	// dumped (their sockets bind it).
	EgressAddr netip.Addr `json:"egress_addr,omitzero"`
	// Turn: the turn whose end took the checkpoint (0: none).
	Turn int `json:"turn,omitempty"`
	// DataKey is the ID of the tenant data key that sealed the images
	// (encrypt.go); "" if they are stored in plaintext.
	DataKey string `json:"data_key,omitempty"`
	// KeyTenant is the tenant whose key DataKey is ("" the host's).
	KeyTenant string `json:"key_tenant,omitempty"`
	// Tenant owns an imported checkpoint (no sandbox of this host's
	// does); ImportedFrom and ImportSigner are its ID on the exporting
	// host and that host's key.
	Tenant       string `json:"tenant,omitempty"`
	ImportedFrom string `json:"imported_from,omitempty"`
	ImportSigner string `json:"import_signer,omitempty"`
	// ParentDigest is the parent's content digest and Signature the
	// host's signature (sign.go): the lineage is a hash chain.
	ParentDigest string     `json:"parent_digest,omitempty"`
	Signature    *Signature `json:"signature,omitempty"`
	// Committed: the checkpoint's metadata record was committed (the
	// engine writes the manifest again after that commit). Without it the
	// directory is a checkpoint a crash kept from committing. It is the
	// record's commit, not the artifact's: the artifact is complete once
	// its manifest exists at all (see Writer.Commit).
	Committed bool `json:"committed,omitempty"`
	// What the record holds besides, so that it can be rebuilt from here.
	Keep         bool           `json:"keep,omitempty"`
	Capture      string         `json:"capture,omitempty"`
	CaptureNote  string         `json:"capture_note,omitempty"`
	StallMS      float64        `json:"stall_ms,omitempty"`
	StallParts   *v1.StallParts `json:"stall_parts,omitempty"`
	DurationMS   float64        `json:"duration_ms,omitempty"`
	BytesWritten int64          `json:"bytes_written,omitempty"`
}

// Encode is the manifest as it is written to disk.
func (mf Manifest) Encode() ([]byte, error) { return json.MarshalIndent(mf, "", "  ") }

// DecodeManifest reads a checkpoint's manifest.json. A manifest is read
// back from disk, where anything may have happened to it, and its fields
// name directories and files: what it returns is one JSON value of a
// known format whose IDs are single path components, whose kind is known
// and whose objects lie inside the checkpoint's directory, each with a
// SHA-256 and a size.
func DecodeManifest(b []byte) (Manifest, error) {
	var mf Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&mf); err != nil {
		return Manifest{}, fmt.Errorf("manifest: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Manifest{}, fmt.Errorf("manifest: data after the manifest: %w", errdefs.ErrInvalidArgument)
	}
	if err := mf.Check(); err != nil {
		return Manifest{}, fmt.Errorf("manifest %q: %w: %w", mf.ID, err, errdefs.ErrInvalidArgument)
	}
	return mf, nil
}

// Check says what makes mf unfit to be read back (see DecodeManifest).
func (mf Manifest) Check() error {
	if mf.Format != Format {
		return fmt.Errorf("format %d, this molt reads %d", mf.Format, Format)
	}
	if !IsName(mf.ID) || !IsName(mf.Sandbox) {
		return errors.New("checkpoint or sandbox ID is not a name")
	}
	if mf.Parent != "" && !IsName(mf.Parent) {
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
		if !localName(o.Path) {
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

// localName reports whether an object's name stays inside its
// checkpoint's area: relative, clean, no "..", and not the area itself.
// IsPath reports whether name is a relative, clean path that stays
// inside a checkpoint: what an object's name must be.
func IsPath(name string) bool { return localName(name) }

func localName(name string) bool {
	return filepath.IsLocal(name) && filepath.Clean(name) == name && name != "."
}

// ImageBytes is the size of the process images among objs.
func ImageBytes(objs []Object) int64 {
	var n int64
	for _, o := range objs {
		if strings.HasPrefix(o.Path, ImagesDir+"/") {
			n += o.Size
		}
	}
	return n
}
