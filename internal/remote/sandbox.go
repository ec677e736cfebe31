package remote

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
)

// SandboxDoc is a sandbox offloaded to the store: hibernated at Head,
// whose recipe is in the store, resumable by any daemon that shares the
// store and trusts the signer.
type SandboxDoc struct {
	Layout  int    `json:"layout"`
	Sandbox string `json:"sandbox"`
	Name    string `json:"name,omitempty"`
	Tenant  string `json:"tenant,omitempty"`
	Head    string `json:"head"`
	// Record is the engine's record of the sandbox, opaque here.
	Record json.RawMessage `json:"record"`
	// Checkpoints are the IDs of the sandbox's other checkpoints in the
	// store (its lineage, for rollbacks after a migration); Head's is
	// not among them.
	Checkpoints []string `json:"checkpoints,omitempty"`
	// History is the sandbox's history object (the engine's turn log
	// and effect ledger, opaque here), by content: PutHistory.
	History *Blob `json:"history,omitempty"`
	// Owner is the key of the host that resumed the sandbox ("" while
	// it waits in the store); Epoch counts the hand-overs.
	Owner     string             `json:"owner,omitempty"`
	Epoch     int64              `json:"epoch"`
	Updated   time.Time          `json:"updated"`
	Signature *ckstore.Signature `json:"signature,omitempty"`
}

func sandboxKey(id string) string { return "sandboxes/" + id + ".json" }

// Blob names an object by content: its SHA-256 (hex) and size.
type Blob struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// MaxHistory bounds a history object.
const MaxHistory = 512 << 20

func historyKey(id, sum string) string { return "history/" + id + "/" + sum }

// PutHistory writes b as sandbox id's history object, named by its
// content (a document naming an older one still reads it), and returns
// the Blob a document names it by.
func (s *Store) PutHistory(ctx context.Context, id string, b []byte) (Blob, error) {
	if !ckstore.IsName(id) || len(b) > MaxHistory {
		return Blob{}, fmt.Errorf("store: history of %q: not a name, or %d bytes (at most %d): %w", id, len(b), MaxHistory, errdefs.ErrInvalidArgument)
	}
	sum := sha256.Sum256(b)
	h := Blob{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(b))}
	if err := s.b.Put(ctx, historyKey(id, h.SHA256), bytes.NewReader(b), h.Size); err != nil {
		return Blob{}, fmt.Errorf("store: write the history of %s: %w", id, err)
	}
	return h, nil
}

// History reads sandbox id's history object h (from a checked
// document) and checks its content against h.
func (s *Store) History(ctx context.Context, id string, h Blob) ([]byte, error) {
	if !ckstore.IsName(id) || len(h.SHA256) != sha256.Size*2 || strings.Trim(h.SHA256, "0123456789abcdef") != "" || h.Size < 0 || h.Size > MaxHistory {
		return nil, bad("history of %q: %+v is not a history object's name", id, h)
	}
	b, err := readAll(ctx, s.b, historyKey(id, h.SHA256), h.Size)
	if err != nil {
		return nil, fmt.Errorf("store: the history of %s: %w", id, err)
	}
	if sum := sha256.Sum256(b); int64(len(b)) != h.Size || hex.EncodeToString(sum[:]) != h.SHA256 {
		return nil, bad("the history of %s does not match its document (%d bytes)", id, len(b))
	}
	return b, nil
}

func (d SandboxDoc) signedBytes() ([]byte, error) {
	d.Signature = nil
	b, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	return append([]byte("molt-sandbox-v1\x00"), b...), nil
}

// PutSandbox writes d, signed by this host, if the document is still
// at version (what SandboxVersion read), or, with version "", if there
// is none: several hosts change a sandbox's document (its owner, on a
// resume or a migration), and of two that read the same version only
// one writes. The other gets objstore.ErrChanged (errdefs.ErrConflict).
func (s *Store) PutSandbox(ctx context.Context, d SandboxDoc, version string) error {
	if !ckstore.IsName(d.Sandbox) || !ckstore.IsName(d.Head) || len(d.Checkpoints) > maxLineage {
		return fmt.Errorf("store: sandbox %q at %q: not names, or more than %d checkpoints: %w", d.Sandbox, d.Head, maxLineage, errdefs.ErrInvalidArgument)
	}
	d.Layout, d.Updated, d.Signature = Layout, time.Now().UTC().Truncate(time.Millisecond), nil
	sig, err := s.sign(d.signedBytes())
	if err != nil {
		return err
	}
	d.Signature = sig
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	if err := s.b.PutIf(ctx, sandboxKey(d.Sandbox), b, version); err != nil {
		return fmt.Errorf("store: write the document of sandbox %s: %w", d.Sandbox, err)
	}
	return nil
}

// Sandbox reads and checks sandbox id's document; a sandbox not in the
// store is errdefs.ErrNotFound.
func (s *Store) Sandbox(ctx context.Context, id string) (SandboxDoc, error) {
	d, _, err := s.SandboxVersion(ctx, id)
	return d, err
}

// SandboxVersion is Sandbox with the version of the document read, for
// PutSandbox.
func (s *Store) SandboxVersion(ctx context.Context, id string) (SandboxDoc, string, error) {
	if !ckstore.IsName(id) {
		return SandboxDoc{}, "", fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	b, version, err := s.b.ReadVersion(ctx, sandboxKey(id), maxSandbox)
	if errors.Is(err, fs.ErrNotExist) {
		return SandboxDoc{}, "", fmt.Errorf("sandbox %s is not in the store %s: %w", id, s.b, errdefs.ErrNotFound)
	}
	if err != nil {
		return SandboxDoc{}, "", fmt.Errorf("store: sandbox %s: %w", id, err)
	}
	d, err := s.checkSandbox(id, b)
	return d, version, err
}

// checkSandbox parses and checks sandbox id's document b.
func (s *Store) checkSandbox(id string, b []byte) (SandboxDoc, error) {
	var d SandboxDoc
	if err := strictJSON(b, &d); err != nil {
		return SandboxDoc{}, bad("sandbox %s: %v", id, err)
	}
	if d.Layout != Layout {
		return SandboxDoc{}, fmt.Errorf("store: sandbox %s: layout %d, this molt reads layout %d: %w", id, d.Layout, Layout, errdefs.ErrNotSupported)
	}
	if d.Sandbox != id || !ckstore.IsName(d.Head) || d.Signature == nil {
		return SandboxDoc{}, bad("sandbox %s: document names sandbox %q at %q, or is not signed", id, d.Sandbox, d.Head)
	}
	if len(d.Checkpoints) > maxLineage {
		return SandboxDoc{}, bad("sandbox %s: %d checkpoints, at most %d", id, len(d.Checkpoints), maxLineage)
	}
	for _, c := range d.Checkpoints {
		if !ckstore.IsName(c) || c == d.Head {
			return SandboxDoc{}, bad("sandbox %s: checkpoint %q: not a name, or its head", id, c)
		}
	}
	sb, err := d.signedBytes()
	if err != nil {
		return SandboxDoc{}, err
	}
	if err := s.k.CheckBytes(*d.Signature, sb); err != nil {
		return SandboxDoc{}, fmt.Errorf("store: sandbox %s: %w", id, err)
	}
	return d, nil
}

// Sandboxes lists the IDs of the sandboxes in the store.
func (s *Store) Sandboxes(ctx context.Context) ([]string, error) {
	keys, err := s.b.List(ctx, "sandboxes/")
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, k := range keys {
		id, ok := strings.CutSuffix(strings.TrimPrefix(k, "sandboxes/"), ".json")
		if ok && ckstore.IsName(id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// DeleteSandbox removes sandbox id's document.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	if !ckstore.IsName(id) {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrInvalidArgument)
	}
	return s.b.Delete(ctx, sandboxKey(id))
}
