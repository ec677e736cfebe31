package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/tenant"
)

// Who may do what: every route has a policy, applied before its handler
// to the request's principal (tenant.Of). The host admin (the unix
// socket) passes every one. A tenant's token passes a route only with
// the route's scope, and reaches only its tenant's objects: a sandbox,
// checkpoint or effect reference is resolved among the objects the token
// reaches, and one it does not reach is answered 404, as one that does
// not exist, so that a token learns nothing of other tenants' objects
// (not even from an ambiguous prefix or a label). The resolved object's
// full ID replaces the reference before the handler runs.

type target int

const (
	tHost       target = iota // host-wide facts any token may read
	tAdmin                    // the host admin's only
	tList                     // the sandbox list: filtered
	tCreate                   // a new sandbox: the token's tenant owns it
	tSandbox                  // path {id}: a sandbox reference
	tStored                   // path {id}: a sandbox reference, or the full ID of one in the object store
	tCheckpoint               // path {id}: a checkpoint reference
	tEffect                   // path {id}: an effect ID
)

type policy struct {
	target target
	scope  string
}

var (
	pHost   = policy{tHost, tenant.ScopeRead}
	pAdmin  = policy{tAdmin, ""}
	pList   = policy{tList, tenant.ScopeRead}
	pCreate = policy{tCreate, tenant.ScopeAdmin}
)

func sb(scope string) policy { return policy{tSandbox, scope} }

// stored is sb for a resume, which may adopt a sandbox of the token's
// tenant from the object store (a migration's target).
func stored(scope string) policy { return policy{tStored, scope} }
func ck(scope string) policy     { return policy{tCheckpoint, scope} }
func eff(scope string) policy    { return policy{tEffect, scope} }

// apiRoute is one API route and its policy.
type apiRoute struct {
	pattern string
	policy  policy
	h       http.Handler
}

func (s *server) guard(p policy, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pr := tenant.Of(r.Context())
		if pr.Admin {
			h.ServeHTTP(w, r)
			return
		}
		if p.target == tAdmin {
			writeError(w, fmt.Errorf("%s %s is the host admin's: %w", r.Method, r.URL.Path, errdefs.ErrPermissionDenied))
			return
		}
		if !pr.Can(p.scope) {
			writeError(w, fmt.Errorf("%s %s needs the %s scope, which this token lacks: %w", r.Method, r.URL.Path, p.scope, errdefs.ErrPermissionDenied))
			return
		}
		var id string
		var err error
		switch p.target {
		case tSandbox:
			id, err = s.ownSandbox(pr, r.PathValue("id"))
		case tStored:
			id, err = s.ownSandbox(pr, r.PathValue("id"))
			if errors.Is(err, errdefs.ErrNotFound) {
				id, err = s.ownStored(r, pr, r.PathValue("id"))
			}
		case tCheckpoint:
			id, err = s.ownCheckpoint(pr, r.PathValue("id"))
		case tEffect:
			id, err = s.ownEffect(r, pr, r.PathValue("id"))
		}
		if err != nil {
			writeError(w, err)
			return
		}
		if id != "" {
			r.SetPathValue("id", id)
		}
		h.ServeHTTP(w, r)
	})
}

// reachable lists the sandboxes pr reaches.
func (s *server) reachable(pr tenant.Principal) ([]meta.Sandbox, error) {
	all, err := s.m.Sandboxes()
	if err != nil {
		return nil, err
	}
	var out []meta.Sandbox
	for _, sb := range all {
		if pr.Reaches(sb.ID, sb.Tenant) {
			out = append(out, sb)
		}
	}
	return out, nil
}

// ownSandbox resolves ref (an ID, a unique ID prefix or a name) among
// the sandboxes pr reaches.
func (s *server) ownSandbox(pr tenant.Principal, ref string) (string, error) {
	sbs, err := s.reachable(pr)
	if err != nil {
		return "", err
	}
	if id, ok := matchSandbox(sbs, ref); ok {
		return id, nil
	}
	return "", fmt.Errorf("sandbox %q: %w", ref, errdefs.ErrNotFound)
}

func matchSandbox(sbs []meta.Sandbox, ref string) (string, bool) {
	var prefixed []string
	for _, sb := range sbs {
		if sb.ID == ref || (sb.Name != "" && sb.Name == ref) {
			return sb.ID, true
		}
		if ref != "" && strings.HasPrefix(sb.ID, ref) {
			prefixed = append(prefixed, sb.ID)
		}
	}
	if len(prefixed) == 1 {
		return prefixed[0], true
	}
	return "", false
}

// ownStored checks that sandbox id, not one of this daemon's, is in the
// object store and pr's tenant's there; only a full ID is looked up.
func (s *server) ownStored(r *http.Request, pr tenant.Principal, id string) (string, error) {
	if sb, err := s.m.StoredSandbox(r.Context(), id); err == nil && sb.ID == id && pr.Reaches(sb.ID, sb.Tenant) {
		return id, nil
	}
	return "", fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
}

// ownCheckpoint resolves ref (an ID, a unique ID prefix, a label, or
// SANDBOX:LABEL) among the checkpoints of the sandboxes pr reaches.
func (s *server) ownCheckpoint(pr tenant.Principal, ref string) (string, error) {
	sbs, err := s.reachable(pr)
	if err != nil {
		return "", err
	}
	sbRef, label, scoped := strings.Cut(ref, ":")
	var byID, byPrefix, byLabel []string
	for _, sb := range sbs {
		if scoped {
			if id, ok := matchSandbox([]meta.Sandbox{sb}, sbRef); !ok || id != sb.ID {
				continue
			}
		}
		cks, err := s.m.Checkpoints(sb.ID)
		if err != nil {
			continue
		}
		for _, c := range cks {
			switch {
			case scoped:
				if c.Label == label {
					byLabel = append(byLabel, c.ID)
				}
			case c.ID == ref:
				byID = append(byID, c.ID)
			default:
				if strings.HasPrefix(c.ID, ref) {
					byPrefix = append(byPrefix, c.ID)
				}
				if c.Label != "" && c.Label == ref {
					byLabel = append(byLabel, c.ID)
				}
			}
		}
	}
	// Imported checkpoints belong to no sandbox: the tenant's own.
	if imp, err := s.m.ImportedCheckpoints(pr.Tenant); err == nil && !scoped {
		for _, c := range imp {
			switch {
			case !pr.Reaches(c.Sandbox, pr.Tenant):
			case c.ID == ref:
				byID = append(byID, c.ID)
			case strings.HasPrefix(c.ID, ref):
				byPrefix = append(byPrefix, c.ID)
			}
		}
	}
	for _, l := range [][]string{byID, byLabel, byPrefix} {
		if l = slices.Compact(l); len(l) == 1 {
			return l[0], nil
		}
		if len(l) > 1 {
			return "", &errdefs.AmbiguousError{Kind: "checkpoint", Ref: ref, Candidates: l}
		}
	}
	return "", fmt.Errorf("checkpoint %q: %w", ref, errdefs.ErrNotFound)
}

// bodyCheckpoint resolves a checkpoint reference from a request's body
// or query (a rollback's target, a recovery's, a fork's, effects since)
// among the request's principal's own, as guard does for the path's: a
// token never names another tenant's checkpoint ("" stays "").
func (s *server) bodyCheckpoint(r *http.Request, ref string) (string, error) {
	pr := tenant.Of(r.Context())
	if pr.Admin || ref == "" {
		return ref, nil
	}
	return s.ownCheckpoint(pr, ref)
}

// ownCompensator checks a tenant's compensator: a command runs only in a
// helper sandbox of its own (named by full ID from here on), and HTTP
// compensators, which the daemon sends from its own network, are the
// host admin's.
func (s *server) ownCompensator(r *http.Request, c *v1.Compensator) error {
	pr := tenant.Of(r.Context())
	if pr.Admin || c == nil {
		return nil
	}
	if c.URL != "" || c.Method != "" {
		return fmt.Errorf("compensator: HTTP compensators are sent from the daemon's network, the host admin's to set; a tenant's run in a helper sandbox of its own: %w", errdefs.ErrPermissionDenied)
	}
	if c.Sandbox == "" {
		return nil // nothing to undo with: the engine says so
	}
	id, err := s.ownSandbox(pr, c.Sandbox)
	if err != nil {
		return fmt.Errorf("compensator's helper: %w", err)
	}
	c.Sandbox = id
	return nil
}

// ownEffect checks that effect id belongs to a sandbox pr reaches.
func (s *server) ownEffect(r *http.Request, pr tenant.Principal, id string) (string, error) {
	sbID, ok := s.m.EffectSandbox(id)
	if ok {
		if sb, err := s.m.Sandbox(r.Context(), sbID); err == nil && pr.Reaches(sb.ID, sb.Tenant) {
			return id, nil
		}
	}
	return "", fmt.Errorf("effect %s: %w", id, errdefs.ErrNotFound)
}

// visible filters a sandbox list to what the request's principal
// reaches.
func visible(r *http.Request, l []meta.Sandbox) []meta.Sandbox {
	pr := tenant.Of(r.Context())
	if pr.Admin {
		return l
	}
	out := []meta.Sandbox{}
	for _, sb := range l {
		if pr.Reaches(sb.ID, sb.Tenant) {
			out = append(out, sb)
		}
	}
	return out
}

// ownedCreate stamps a new sandbox's tenant: a token's own, whatever was
// sent. A tenant's sandbox keeps molt's system call filter and has
// limits: no unconfined or custom filter, no limit removed (-1).
func ownedCreate(r *http.Request, req *v1.SandboxCreateRequest) error {
	pr := tenant.Of(r.Context())
	if pr.Admin {
		return nil
	}
	req.Tenant = pr.Tenant
	if (req.Seccomp != "" && req.Seccomp != v1.SeccompDefault) || req.SeccompProfile != "" {
		return fmt.Errorf("create: a tenant's sandbox keeps molt's system call filter (seccomp %q): %w", req.Seccomp, errdefs.ErrPermissionDenied)
	}
	res := req.Resources
	if res.MemoryBytes < 0 || res.Pids < 0 || res.CPUMillis < 0 || res.DiskBytes < 0 || res.StandbyBudgetBytes < 0 {
		return fmt.Errorf("create: a tenant's sandbox cannot go without a limit (-1): %w", errdefs.ErrPermissionDenied)
	}
	return nil
}
