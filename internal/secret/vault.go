package secret

import (
	"fmt"
	"sync"

	"github.com/molt-sh/molt/internal/keys"
)

// Vault redacts and seals what the turn log and the ledgers keep of a
// sandbox. It is safe for concurrent use; a nil *Vault redacts and seals
// nothing (stores as before).
type Vault struct {
	ring *keys.Ring
	red  *Redactor
	// tenant returns the tenant of a sandbox ("": the host's own); known
	// returns its declared secret values and secret-looking env values,
	// asked once per sandbox (a daemon restart asks again).
	tenant func(sb string) (string, error)
	known  func(sb string) []string

	mu     sync.Mutex
	values map[string]map[string]bool // +checklocks:mu
}

// NewVault returns a vault sealing with ring's keys of each sandbox's
// tenant (tenant says which), redacting with red and each sandbox's
// known values.
func NewVault(ring *keys.Ring, red *Redactor, tenant func(string) (string, error), known func(string) []string) *Vault {
	return &Vault{ring: ring, red: red, tenant: tenant, known: known, values: map[string]map[string]bool{}}
}

// Whole reports whether what is stored is sealed whole (encryption at
// rest is on), not only where redaction changed it.
func (v *Vault) Whole() bool { return v != nil && v.ring.Encrypting() }

// valuesOf returns sb's secret values, loading them on first use.
func (v *Vault) valuesOf(sb string) []string {
	v.mu.Lock()
	set, ok := v.values[sb]
	v.mu.Unlock()
	if !ok {
		var loaded []string
		if v.known != nil {
			loaded = v.known(sb)
		}
		v.mu.Lock()
		if set, ok = v.values[sb]; !ok {
			set = map[string]bool{}
			v.values[sb] = set
		}
		for _, x := range loaded {
			set[x] = true
		}
		v.mu.Unlock()
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]string, 0, len(set))
	for x := range set {
		out = append(out, x)
	}
	return out
}

// Learn adds the values text assigns to secret-looking names (a
// session's `export DB_PASSWORD=...`) to sb's secrets.
func (v *Vault) Learn(sb, text string) {
	if v == nil {
		return
	}
	vals := Assigned(text)
	if len(vals) == 0 {
		return
	}
	v.valuesOf(sb) // loaded first, so the load does not drop these
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, x := range vals {
		v.values[sb][x] = true
	}
}

// Add adds values to sb's secrets (a fork inherits its source's).
func (v *Vault) Add(sb string, values []string) {
	if v == nil || len(values) == 0 {
		return
	}
	v.valuesOf(sb)
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, x := range values {
		if len(x) >= minValue {
			v.values[sb][x] = true
		}
	}
}

// Values returns sb's secret values (to pass on to a fork).
func (v *Vault) Values(sb string) []string {
	if v == nil {
		return nil
	}
	return v.valuesOf(sb)
}

// Forget drops what the vault holds of sb (removed).
func (v *Vault) Forget(sb string) {
	if v == nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.values, sb)
}

// Redact returns s with sb's secrets and whatever looks like a
// credential replaced by Mark.
func (v *Vault) Redact(sb, s string) string {
	if v == nil {
		return s
	}
	return v.red.Redact(s, v.valuesOf(sb))
}

// Seal seals plain under the current key of sb's tenant, bound to aad.
func (v *Vault) Seal(sb string, plain, aad []byte) ([]byte, error) {
	t, err := v.tenant(sb)
	if err != nil {
		return nil, err
	}
	k, err := v.ring.Current(t)
	if err != nil {
		return nil, err
	}
	return k.Seal(plain, aad)
}

// Open opens what Seal sealed for sb. A shredded key is an error
// wrapping keys.ErrShredded.
func (v *Vault) Open(sb string, sealed, aad []byte) ([]byte, error) {
	t, err := v.tenant(sb)
	if err != nil {
		return nil, err
	}
	p, err := v.ring.Open(t, sealed, aad)
	if err != nil {
		return nil, fmt.Errorf("sealed record of sandbox %s: %w", sb, err)
	}
	return p, nil
}
