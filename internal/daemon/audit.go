package daemon

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"

	"github.com/molt-sh/molt/internal/audit"
	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/httpapi"
)

// openAudit opens the audit log under root and says loudly what Open
// repaired or set aside.
func openAudit(root string, log *slog.Logger) (*audit.Log, error) {
	l, err := audit.Open(filepath.Join(root, "audit"), audit.Options{})
	if err != nil {
		return nil, err
	}
	if r := l.Repaired(); r != nil {
		log.Warn("audit log: cut a torn last entry (a crash in the middle of an append)", "path", l.Path(), "offset", r.Offset, "bytes", r.Bytes)
	}
	if d := l.Damaged(); d != nil {
		log.Error("AUDIT LOG DAMAGED: set aside, a new segment starts (its first entry says why)", "moved", d.Moved, "seq", d.Seq, "reason", d.Reason)
	}
	if p := l.AnchorProblem(); p != "" {
		log.Error("audit log anchor: replaced with the log's head", "problem", p)
	}
	return l, nil
}

// auditLedger records every effect-ledger record in l. The entry is
// written before the proxy goes on and synced by the group commit a few
// milliseconds later: the ledger has already synced the record itself
// (an effect's before it leaves the host), and waiting for a second
// fdatasync would double what every effect costs.
func auditLedger(l *audit.Log, log *slog.Logger) func(ledger.Record) {
	return func(r ledger.Record) {
		if _, err := l.AppendAsync(audit.EffectEntry(r)); err != nil {
			log.Error("audit log: cannot record an effect", "sandbox", r.Sandbox, "effect", r.ID, "err", err)
		}
	}
}

// auditedAPI is the API handler with the audit log's endpoints, every
// request logged in l.
func auditedAPI(m httpapi.Engine, co httpapi.LLMEndpoints, l *audit.Log, log *slog.Logger, extra ...httpapi.Route) http.Handler {
	h := httpapi.Handler(m, co, log, append(httpapi.AuditRoutes(l), extra...)...)
	return audit.Middleware(l, h, func(err error) {
		log.Error("audit log: cannot record an API request", "err", err)
	})
}

// peerContext gives each connection's requests the socket peer's
// credentials, the Actor the audit log records.
func peerContext(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	cred, err := peerCred(uc)
	if err != nil {
		return ctx
	}
	return audit.WithActor(ctx, audit.Actor{UID: cred.Uid, GID: cred.Gid, PID: cred.Pid})
}
