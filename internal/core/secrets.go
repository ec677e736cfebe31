package core

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/secret"
)

// Secret hygiene (docs/security.md, "Secret hygiene"): secrets passed by
// reference are kept sealed in the sandbox's record and opened only to
// start its init; the turn log and the ledger are redacted and sealed
// through m.vault (internal/secret).

// secretsAAD binds a sandbox's sealed secrets to its ID: a record's blob
// copied into another record does not open.
func secretsAAD(id string) []byte { return []byte("molt secrets v1\x00" + id) }

// sealSecrets keeps values as rec's secrets: their names in the clear,
// their values sealed with the current key of rec's tenant.
func (m *Manager) sealSecrets(rec *sandboxRec, values map[string]string) error {
	if len(values) == 0 {
		rec.Secrets, rec.SealedSecrets = nil, nil
		return nil
	}
	k, err := m.keys.Current(rec.Tenant)
	if err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	plain, err := json.Marshal(values)
	if err != nil {
		return err
	}
	if rec.SealedSecrets, err = k.Seal(plain, secretsAAD(rec.ID)); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	rec.Secrets = slices.Sorted(maps.Keys(values))
	return nil
}

// openSecrets returns rec's secrets (none: nil). A shredded tenant key
// is an error wrapping keys.ErrShredded.
func (m *Manager) openSecrets(rec sandboxRec) (map[string]string, error) {
	if len(rec.SealedSecrets) == 0 {
		return nil, nil
	}
	plain, err := m.keys.Open(rec.Tenant, rec.SealedSecrets, secretsAAD(rec.ID))
	if err != nil {
		return nil, fmt.Errorf("secrets of sandbox %s: %w", rec.ID, err)
	}
	var out map[string]string
	if err := json.Unmarshal(plain, &out); err != nil {
		return nil, fmt.Errorf("secrets of sandbox %s: %v: %w", rec.ID, err, errdefs.ErrFailedPrecondition)
	}
	return out, nil
}

// initEnv is the environment of rec's init (and so of every process it
// starts): its env and its secrets, which win.
func (m *Manager) initEnv(rec sandboxRec) (map[string]string, error) {
	s, err := m.openSecrets(rec)
	if err != nil || len(s) == 0 {
		return rec.Env, err
	}
	env := maps.Clone(rec.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, s)
	return env, nil
}

// learnExecEnv adds the values of an exec's secret-looking variables to
// the sandbox's values to redact (its output may print them).
func (m *Manager) learnExecEnv(id string, env map[string]string) {
	var vs []string
	for k, v := range env {
		if secret.SecretName(k) {
			vs = append(vs, v)
		}
	}
	m.vault.Add(id, vs)
}

// forkSecrets gives the fork rec its source's secrets, sealed again for
// its own ID (and learned values, for redaction).
func (m *Manager) forkSecrets(rec *sandboxRec, src sandboxRec) error {
	m.noteTenant(rec.ID, rec.Tenant)
	m.vault.Add(rec.ID, m.vault.Values(src.ID))
	s, err := m.openSecrets(src)
	if err != nil {
		return err
	}
	return m.sealSecrets(rec, s)
}

// newVault returns the redaction and sealing of the turn log and the
// ledgers, with the daemon's patterns.
func (m *Manager) newVault() (*secret.Vault, error) {
	red, err := secret.NewRedactor(m.cfg.Redact)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return secret.NewVault(m.keys, red, m.tenantOf, m.secretValues), nil
}

// noteTenant remembers the tenant of a sandbox not yet recorded (a fork
// whose ledger is branched before its record is written).
func (m *Manager) noteTenant(id, tenant string) { m.tenants.Store(id, tenant) }

// tenantOf is the tenant of sandbox id.
func (m *Manager) tenantOf(id string) (string, error) {
	var rec sandboxRec
	if err := m.db.Get(meta.Sandboxes, id, &rec); err == nil {
		return rec.Tenant, nil
	}
	if t, ok := m.tenants.Load(id); ok {
		return t.(string), nil
	}
	return "", fmt.Errorf("sandbox %s: no record to find its tenant's key: %w", id, errdefs.ErrNotFound)
}

// secretValues are the values redacted from sandbox id's records beyond
// the patterns: its secrets, its env values of secret-looking names, and
// the values its recorded commands assigned to such names.
func (m *Manager) secretValues(id string) []string {
	var rec sandboxRec
	if err := m.db.Get(meta.Sandboxes, id, &rec); err != nil {
		return nil
	}
	var out []string
	for k, v := range rec.Env {
		if secret.SecretName(k) {
			out = append(out, v)
		}
	}
	if s, err := m.openSecrets(rec); err == nil {
		for _, v := range s {
			out = append(out, v)
		}
	}
	log, _ := m.turns.ExactLog(id)
	for _, tr := range log {
		for _, c := range tr.Commands {
			out = append(append(out, secret.Assigned(c.Command)...), secret.Assigned(strings.Join(c.Args, " "))...)
		}
	}
	return out
}

// effectView is r as the API shows it: redacted.
func (m *Manager) effectView(r ledger.Record) ledger.Record { return m.ledger.View(r) }

func (m *Manager) effectViews(l []ledger.Record) []ledger.Record {
	out := make([]ledger.Record, len(l))
	for i, r := range l {
		out[i] = m.effectView(r)
	}
	return out
}
