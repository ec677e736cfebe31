package remote

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"time"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
)

// Layout is the version of the store's layout this package reads and
// writes.
const Layout = 1

// Limits on what is read from the store.
const (
	maxRecipe   = 64 << 20
	maxObjects  = 100_000
	maxExtents  = 4 << 20
	maxObject   = 64 << 30
	maxSandbox  = 16 << 20
	maxLineage  = 10_000
	maxPackSize = 1 << 30
)

// Extent is Len bytes of a pack from Off: the next bytes of an object.
// In a recipe, P indexes the recipe's Packs; Pack is the name itself
// while an upload runs.
type Extent struct {
	P    int    `json:"p"`
	Off  int64  `json:"o"`
	Len  int64  `json:"n"`
	Pack string `json:"-"`
}

// Object is one stored object: its name in the checkpoint, its size and
// SHA-256 (of the bytes stored, as the checkpoint's record has them) and
// where its bytes are.
//
// The file tree is cut: Cuts are the lengths of its chunks in order
// (encodeCuts), and its SHA256 is that of its chunks' SHA-256s one after
// the other.
type Object struct {
	Name    string   `json:"name"`
	Size    int64    `json:"size"`
	SHA256  string   `json:"sha256"`
	Extents []Extent `json:"extents"`
	Cuts    string   `json:"cuts,omitempty"`
}

// Recipe says how to rebuild one checkpoint's artifact from the store.
type Recipe struct {
	Layout     int       `json:"layout"`
	Checkpoint string    `json:"checkpoint"`
	Sandbox    string    `json:"sandbox"`
	Uploaded   time.Time `json:"uploaded"`
	// Record is the engine's record of the checkpoint, opaque here.
	Record json.RawMessage `json:"record"`
	// Manifest is the artifact's signed manifest, as stored.
	Manifest []byte `json:"manifest"`
	// Packs names the packs the extents index.
	Packs   []string `json:"packs"`
	Objects []Object `json:"objects"`
	// Tree is the checkpoint's file tree as a tar stream (nil for none).
	Tree *Object `json:"tree,omitempty"`
	// Signature is the uploading host's, over the recipe without it.
	Signature *ckstore.Signature `json:"signature,omitempty"`
}

// Size is the bytes a fetch of r writes: its objects and its file tree.
func (r Recipe) Size() int64 {
	var n int64
	for _, o := range r.Objects {
		n += o.Size
	}
	if r.Tree != nil {
		n += r.Tree.Size
	}
	return n
}

var packName = regexp.MustCompile(`^[0-9a-f]{64}$`)

func bad(format string, a ...any) error {
	return fmt.Errorf("store: "+format+": %w", append(a, errdefs.ErrFailedPrecondition)...)
}

// signedBytes is what a recipe's signature covers.
func (r Recipe) signedBytes() ([]byte, error) {
	r.Signature = nil
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return append([]byte("molt-recipe-v1\x00"), b...), nil
}

// check checks the object's name and extents.
func (o Object) check(what string, names bool, packs int) error {
	if names && !ckstore.IsPath(o.Name) {
		return bad("%s: object name %q is not inside its checkpoint", what, o.Name)
	}
	if o.Size < 0 || o.Size > maxObject {
		return bad("%s: object %s: size %d", what, o.Name, o.Size)
	}
	var sum int64
	for _, e := range o.Extents {
		if e.P < 0 || e.P >= packs || e.Off < 0 || e.Len <= 0 || e.Off > maxPackSize || e.Len > maxPackSize {
			return bad("%s: object %s: extent %+v", what, o.Name, e)
		}
		sum += e.Len
		if sum > o.Size {
			break
		}
	}
	if sum != o.Size {
		return bad("%s: object %s: extents of %d bytes for a size of %d", what, o.Name, sum, o.Size)
	}
	return nil
}

// decodeRecipe decodes and checks a recipe read from the store: its
// shape, its names and extents and its signature by a key k trusts.
func decodeRecipe(b []byte, id string, k *ckstore.Keyring) (Recipe, error) {
	var r Recipe
	if err := strictJSON(b, &r); err != nil {
		return Recipe{}, bad("checkpoint %s: recipe: %v", id, err)
	}
	if r.Layout != Layout {
		return Recipe{}, fmt.Errorf("store: checkpoint %s: recipe of layout %d, this molt reads layout %d: %w", id, r.Layout, Layout, errdefs.ErrNotSupported)
	}
	if r.Checkpoint != id || !ckstore.IsName(r.Sandbox) {
		return Recipe{}, bad("recipe of checkpoint %s names checkpoint %q, sandbox %q", id, r.Checkpoint, r.Sandbox)
	}
	if len(r.Objects) > maxObjects {
		return Recipe{}, bad("checkpoint %s: %d objects", id, len(r.Objects))
	}
	if len(r.Packs) > maxObjects {
		return Recipe{}, bad("checkpoint %s: %d packs", id, len(r.Packs))
	}
	for _, p := range r.Packs {
		if !packName.MatchString(p) {
			return Recipe{}, bad("checkpoint %s: pack %q", id, p)
		}
	}
	extents := 0
	seen := map[string]bool{}
	for _, o := range r.Objects {
		if err := o.check("checkpoint "+id, true, len(r.Packs)); err != nil {
			return Recipe{}, err
		}
		if o.Cuts != "" {
			return Recipe{}, bad("checkpoint %s: object %s: chunk lengths are for the file tree", id, o.Name)
		}
		if seen[o.Name] {
			return Recipe{}, bad("checkpoint %s: object %s listed twice", id, o.Name)
		}
		seen[o.Name] = true
		extents += len(o.Extents)
	}
	if r.Tree != nil {
		if err := r.Tree.check("checkpoint "+id+": file tree", false, len(r.Packs)); err != nil {
			return Recipe{}, err
		}
		if _, err := decodeCuts(r.Tree.Cuts, r.Tree.Size); err != nil {
			return Recipe{}, fmt.Errorf("checkpoint %s: file tree: %w", id, err)
		}
		extents += len(r.Tree.Extents)
	}
	if extents > maxExtents {
		return Recipe{}, bad("checkpoint %s: %d extents", id, extents)
	}
	if r.Signature == nil {
		return Recipe{}, bad("checkpoint %s: the recipe is not signed", id)
	}
	sb, err := r.signedBytes()
	if err != nil {
		return Recipe{}, err
	}
	if err := k.CheckBytes(*r.Signature, sb); err != nil {
		return Recipe{}, fmt.Errorf("store: checkpoint %s: recipe: %w", id, err)
	}
	return r, nil
}

// strictJSON decodes exactly one JSON value with no unknown fields.
func strictJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return fmt.Errorf("data after the JSON value")
	}
	return nil
}
