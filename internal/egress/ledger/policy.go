package ledger

import (
	"fmt"
	"strings"

	"github.com/molt-sh/molt/internal/errdefs"
)

// Effect policies: what a rollback that would orphan a committed effect
// does with it, per sandbox and per kind of effect (api/v1's
// EffectRefuse, EffectCompensate, EffectAllow).
const (
	PolicyRefuse     = "refuse"
	PolicyCompensate = "compensate"
	PolicyAllow      = "allow"
)

// What a rollback does to one orphaned effect.
const (
	ActCompensate = "compensate" // its compensator runs
	ActBlock      = "block"      // the rollback is refused unless forced
	ActOrphan     = "orphan"     // the world keeps it; replayed if re-sent
)

// Decision is the policy's verdict on one orphaned effect.
type Decision struct {
	Kind   string // the policy's kind that decided; "" for the default
	Policy string // "" for the default
	Action string
	Reason string
}

// CheckPolicy validates a sandbox's effect policy.
func CheckPolicy(p map[string]string) error {
	for k, v := range p {
		if k == "" || len(k) > 64 || strings.Trim(k, "abcdefghijklmnopqrstuvwxyz0123456789._-*") != "" || (strings.Contains(k, "*") && k != "*") {
			return fmt.Errorf("effect policy kind %q: want http, opaque, declared, a declared type ([a-z0-9._-], at most 64) or *: %w", k, errdefs.ErrInvalidArgument)
		}
		switch v {
		case PolicyRefuse, PolicyCompensate, PolicyAllow:
		default:
			return fmt.Errorf("effect policy %s=%q: want refuse, compensate or allow: %w", k, v, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Kinds lists the policy kinds r has, most specific first: a declared
// effect's Type, then declared, http (a proxied HTTP or inspected HTTPS
// request) or opaque, then *.
func Kinds(r Record) []string {
	var out []string
	if r.Declared && r.Type != "" {
		out = append(out, strings.ToLower(r.Type))
	}
	switch {
	case r.Declared:
		out = append(out, "declared")
	case r.Kind == Opaque:
		out = append(out, "opaque")
	case r.Request.Proto == "http" || r.Request.Proto == "https":
		out = append(out, "http")
	}
	if r.Declared && r.Kind == Opaque {
		out = append(out, "opaque")
	}
	return append(out, "*")
}

// Decide applies policy p to r, a committed effect a rollback would
// orphan. Without a kind of r in p, the default: compensate when r has a
// compensator, block when others consumed it without one, else orphan.
func Decide(p map[string]string, r Record) Decision {
	for _, k := range Kinds(r) {
		pol, ok := p[k]
		if !ok {
			continue
		}
		d := Decision{Kind: k, Policy: pol}
		switch pol {
		case PolicyRefuse:
			d.Action, d.Reason = ActBlock, fmt.Sprintf("the sandbox's policy refuses to orphan %s effects", k)
		case PolicyCompensate:
			if r.Compensator != nil {
				d.Action = ActCompensate
			} else {
				d.Action, d.Reason = ActBlock, fmt.Sprintf("the sandbox's policy compensates %s effects and this one has no compensator", k)
			}
		default:
			d.Action = ActOrphan
		}
		return d
	}
	switch {
	case r.Compensator != nil:
		return Decision{Action: ActCompensate}
	case len(r.Consumers) > 0:
		return Decision{Action: ActBlock, Reason: "others consumed it and nothing compensates it"}
	}
	return Decision{Action: ActOrphan}
}
