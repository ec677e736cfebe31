package audit

import (
	"net/url"

	"github.com/molt-sh/molt/internal/egress/ledger"
)

// EffectEntry describes an effect-ledger record: its ID, sandbox, kind,
// state, method, and its URL's host and path (never the query, headers
// or bodies, which can hold credentials).
func EffectEntry(r ledger.Record) Entry {
	e := Entry{Kind: KindEffect, Effect: r.ID, Sandbox: r.Sandbox, EffectKind: string(r.Kind), State: string(r.State),
		Method: r.Request.Method, Host: r.Request.Host}
	if r.Request.URL != "" {
		if u, err := url.Parse(r.Request.URL); err == nil {
			e.Host, e.URLPath = u.Host, u.EscapedPath()
		}
	}
	if e.Host == "" {
		e.Host = r.Request.Addr
	}
	if r.Request.Proto != "" && e.Method == "" {
		e.Method = r.Request.Proto
	}
	return e
}
