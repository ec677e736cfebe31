package keys

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/atomicfile"
	"github.com/molt-sh/molt/internal/errdefs"
)

// ErrShredded is the error of data whose key was shredded (or never
// was on this host): it cannot be read, by design.
var ErrShredded = errors.New("its data key is gone (shredded, or from another host)")

// localKEKFile is the KEK a daemon started without one generates, in the
// keys directory: it seals what must never be stored in plaintext
// (secrets passed by reference) even when encryption at rest is off. It
// sits beside the data, so it protects against a copied metadata file,
// not a copied disk; a daemon given a KEK re-wraps every key under it
// and removes this file.
const localKEKFile = "local.kek"

// Ring is a host's data keys: per tenant, its DEKs, stored wrapped by
// the KEK in one file per tenant under a directory of the daemon's root.
// It is safe for concurrent use.
type Ring struct {
	dir string
	kek KEK
	// external is whether kek came from the operator (encryption at
	// rest is on) rather than localKEKFile.
	external bool

	mu sync.Mutex
	// +checklocks:mu
	keys map[string]*DataKey // by ID, unwrapped
	// +checklocks:mu
	current map[string]*DataKey // by tenant: what Current returned last
}

// tenantKeys is the file of one tenant's wrapped keys.
type tenantKeys struct {
	Tenant string       `json:"tenant"`
	Keys   []wrappedKey `json:"keys"` // oldest first; the last is current
}

type wrappedKey struct {
	ID      string    `json:"id"`
	KEK     string    `json:"kek"`
	Wrapped []byte    `json:"wrapped"`
	Created time.Time `json:"created"`
}

// KeyInfo describes one data key (never its material).
type KeyInfo struct {
	Tenant  string    `json:"tenant"`
	ID      string    `json:"id"`
	KEK     string    `json:"kek"`
	Current bool      `json:"current"`
	Created time.Time `json:"created"`
}

var tenantRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// OpenRing opens the ring in dir (created if missing). With kek nil the
// ring uses (and creates) the local KEK: it seals secrets, and Encrypting
// reports false. With a kek, keys wrapped by the local KEK or by
// previous (the KEK being rotated out; may be nil) are re-wrapped under
// kek first; a key wrapped by any other KEK is an error: the daemon was
// started with the wrong one.
func OpenRing(dir string, kek, previous KEK) (*Ring, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	r := &Ring{dir: dir, kek: kek, external: kek != nil, keys: map[string]*DataKey{}, current: map[string]*DataKey{}}
	local, err := r.localKEK(kek == nil)
	if err != nil {
		return nil, err
	}
	if kek == nil {
		r.kek = local
	}
	olds := map[string]KEK{}
	for _, k := range []KEK{local, previous} {
		if k != nil && k.ID() != r.kek.ID() {
			olds[k.ID()] = k
		}
	}
	if _, err := r.rewrap(olds); err != nil {
		return nil, err
	}
	if kek != nil && local != nil {
		if err := os.Remove(filepath.Join(dir, localKEKFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return r, nil
}

// localKEK reads the local KEK, creating it if create; nil if there is
// none and create is false.
func (r *Ring) localKEK(create bool) (KEK, error) {
	p := filepath.Join(r.dir, localKEKFile)
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		if !create {
			return nil, nil
		}
		k := make([]byte, KeySize)
		if _, err := rand.Read(k); err != nil {
			return nil, err
		}
		if err := atomicfile.Write(p, []byte(hex.EncodeToString(k)+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	return FileKEK(p)
}

// Encrypting reports whether the operator gave a KEK: checkpoints,
// turn logs and ledgers are then encrypted at rest.
func (r *Ring) Encrypting() bool { return r.external }

// KEKID is the ID of the KEK in use.
func (r *Ring) KEKID() string { return r.kek.ID() }

// fileOf is the file of tenant's keys ("" is the host's own sandboxes).
func (r *Ring) fileOf(tenant string) (string, error) {
	if tenant == "" {
		return filepath.Join(r.dir, "host.json"), nil
	}
	if !tenantRE.MatchString(tenant) {
		return "", fmt.Errorf("tenant %q is not a tenant name: %w", tenant, errdefs.ErrInvalidArgument)
	}
	return filepath.Join(r.dir, "tenant-"+tenant+".json"), nil
}

// +checklocks:r.mu
func (r *Ring) load(tenant string) (tenantKeys, error) {
	p, err := r.fileOf(tenant)
	if err != nil {
		return tenantKeys{}, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return tenantKeys{Tenant: tenant}, nil
	}
	if err != nil {
		return tenantKeys{}, err
	}
	var tk tenantKeys
	if err := json.Unmarshal(b, &tk); err != nil || tk.Tenant != tenant {
		return tenantKeys{}, fmt.Errorf("keys of tenant %q: %s is unreadable or not theirs: %w", tenant, p, errdefs.ErrFailedPrecondition)
	}
	return tk, nil
}

// +checklocks:r.mu
func (r *Ring) store(tk tenantKeys) error {
	p, err := r.fileOf(tk.Tenant)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(tk, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(p, b, 0o600)
}

// wrapAAD binds a wrapped key to its tenant and ID.
func wrapAAD(tenant, id string) []byte {
	return []byte("molt dek v1\x00" + tenant + "\x00" + id)
}

// +checklocks:r.mu
func (r *Ring) unwrap(tenant string, w wrappedKey) (*DataKey, error) {
	if k, ok := r.keys[w.ID]; ok {
		return k, nil
	}
	if w.KEK != r.kek.ID() {
		return nil, fmt.Errorf("data key %s of tenant %q is wrapped by key-encryption key %s, and this daemon has %s: start it with that one (or with it as the previous one, to rotate): %w", w.ID, tenant, w.KEK, r.kek.ID(), errdefs.ErrFailedPrecondition)
	}
	raw, err := r.kek.Unwrap(w.Wrapped, wrapAAD(tenant, w.ID))
	if err != nil {
		return nil, fmt.Errorf("data key %s of tenant %q does not unwrap: %v: %w", w.ID, tenant, err, errdefs.ErrFailedPrecondition)
	}
	k, err := newDataKey(tenant, w.ID, raw)
	if err != nil {
		return nil, err
	}
	r.keys[w.ID] = k
	return k, nil
}

// Current returns the DEK tenant's new data is sealed with, making the
// tenant's first one if it has none.
func (r *Ring) Current(tenant string) (*DataKey, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Every sealed record asks: the key file is read once, then again
	// only after a rotation or a shredding (both go through this ring).
	if k, ok := r.current[tenant]; ok && k.usable() == nil {
		return k, nil
	}
	tk, err := r.load(tenant)
	if err != nil {
		return nil, err
	}
	var k *DataKey
	if len(tk.Keys) == 0 {
		k, err = r.addKey(tk)
	} else {
		k, err = r.unwrap(tenant, tk.Keys[len(tk.Keys)-1])
	}
	if err == nil {
		r.current[tenant] = k
	}
	return k, err
}

// Rotate makes a new DEK tenant's current one. Earlier DEKs stay, to
// read what they sealed: rotation rewrites no data.
func (r *Ring) Rotate(tenant string) (*DataKey, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tk, err := r.load(tenant)
	if err != nil {
		return nil, err
	}
	return r.addKey(tk)
}

// +checklocks:r.mu
func (r *Ring) addKey(tk tenantKeys) (*DataKey, error) {
	raw := make([]byte, KeySize)
	idb := make([]byte, 8)
	if _, err := rand.Read(raw); err != nil {
		return nil, err
	}
	if _, err := rand.Read(idb); err != nil {
		return nil, err
	}
	id := hex.EncodeToString(idb)
	w, err := r.kek.Wrap(raw, wrapAAD(tk.Tenant, id))
	if err != nil {
		return nil, fmt.Errorf("wrap a data key: %w", err)
	}
	tk.Keys = append(tk.Keys, wrappedKey{ID: id, KEK: r.kek.ID(), Wrapped: w, Created: time.Now().UTC()})
	if err := r.store(tk); err != nil {
		return nil, err
	}
	k, err := newDataKey(tk.Tenant, id, raw)
	if err != nil {
		return nil, err
	}
	r.keys[id] = k
	r.current[tk.Tenant] = k
	return k, nil
}

// Key returns tenant's DEK id. A key the tenant does not have (shredded,
// or another tenant's) is ErrShredded.
func (r *Ring) Key(tenant, id string) (*DataKey, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if k, ok := r.keys[id]; ok && k.Tenant == tenant {
		return k, nil
	}
	tk, err := r.load(tenant)
	if err != nil {
		return nil, err
	}
	for _, w := range tk.Keys {
		if w.ID == id {
			return r.unwrap(tenant, w)
		}
	}
	return nil, fmt.Errorf("data key %s of tenant %q: %w: %w", id, tenant, ErrShredded, errdefs.ErrFailedPrecondition)
}

// Shred deletes every DEK of tenant, for good: what they sealed cannot
// be read any more. The tenant's next data gets a new key.
func (r *Ring) Shred(tenant string) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tk, err := r.load(tenant)
	if err != nil {
		return 0, err
	}
	p, _ := r.fileOf(tenant)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	if err := atomicfile.SyncDir(r.dir); err != nil {
		return 0, err
	}
	for _, w := range tk.Keys {
		if k, ok := r.keys[w.ID]; ok {
			k.forget()
			delete(r.keys, w.ID)
		}
	}
	delete(r.current, tenant)
	return len(tk.Keys), nil
}

// List describes every data key of the host.
func (r *Ring) List() ([]KeyInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tenants, err := r.tenants()
	if err != nil {
		return nil, err
	}
	var out []KeyInfo
	for _, t := range tenants {
		tk, err := r.load(t)
		if err != nil {
			return nil, err
		}
		for i, w := range tk.Keys {
			out = append(out, KeyInfo{Tenant: t, ID: w.ID, KEK: w.KEK, Current: i == len(tk.Keys)-1, Created: w.Created})
		}
	}
	return out, nil
}

// tenants lists the tenants that have key files.
// +checklocks:r.mu
func (r *Ring) tenants() ([]string, error) {
	ents, err := os.ReadDir(r.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		switch {
		case n == "host.json":
			out = append(out, "")
		case strings.HasPrefix(n, "tenant-") && strings.HasSuffix(n, ".json"):
			if t := strings.TrimSuffix(strings.TrimPrefix(n, "tenant-"), ".json"); tenantRE.MatchString(t) {
				out = append(out, t)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// rewrap re-wraps under r.kek every key wrapped by one of olds (by ID),
// and returns how many it re-wrapped.
func (r *Ring) rewrap(olds map[string]KEK) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tenants, err := r.tenants()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, t := range tenants {
		tk, err := r.load(t)
		if err != nil {
			return n, err
		}
		changed := false
		for i, w := range tk.Keys {
			old, ok := olds[w.KEK]
			if !ok {
				continue
			}
			raw, err := old.Unwrap(w.Wrapped, wrapAAD(t, w.ID))
			if err != nil {
				return n, fmt.Errorf("data key %s of tenant %q does not unwrap with %s: %v: %w", w.ID, t, w.KEK, err, errdefs.ErrFailedPrecondition)
			}
			nw, err := r.kek.Wrap(raw, wrapAAD(t, w.ID))
			if err != nil {
				return n, err
			}
			tk.Keys[i].Wrapped, tk.Keys[i].KEK = nw, r.kek.ID()
			changed = true
			n++
		}
		if changed {
			if err := r.store(tk); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}
