package httpapi

import (
	"fmt"
	"net/http"
	"strconv"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/audit"
	"github.com/molt-sh/molt/internal/errdefs"
)

// Route is an endpoint served next to the Engine's.
type Route struct {
	Pattern string
	Handler http.Handler
}

// AuditRoutes serves the audit log l: GET /v1/audit?since=SEQ streams the
// entries after SEQ as the file holds them; POST /v1/audit/verify checks
// the log against its anchor.
func AuditRoutes(l *audit.Log) []Route {
	return []Route{
		{"GET /v1/audit", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var since uint64
			if q := r.URL.Query().Get("since"); q != "" {
				n, err := strconv.ParseUint(q, 10, 64)
				if err != nil {
					writeError(w, fmt.Errorf("since %q: want a seq: %w", q, errdefs.ErrInvalidArgument))
					return
				}
				since = n
			}
			w.Header().Set("Content-Type", "application/x-ndjson")
			// Once the first line is out the status is sent: a failure
			// after it cuts the stream, which the client sees as an
			// unexpected end of the chunked body.
			_ = l.Export(w, since)
		})},
		{"POST /v1/audit/verify", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rep, err := l.Verify()
			res := AuditResult(rep)
			res.File = l.Path()
			reply(w, res, err)
		})},
	}
}

// AuditResult converts a verification's report to its wire form.
func AuditResult(r audit.Report) v1.AuditVerifyResult {
	out := v1.AuditVerifyResult{OK: r.OK, Entries: r.Entries, FirstSeq: r.FirstSeq, Head: v1.AuditHead(r.Head),
		Partial: r.Partial, Segment: r.Segment, BadSeq: r.BadSeq, BadLine: r.BadLine, Problem: r.Problem}
	if r.Anchor != nil {
		a := v1.AuditHead(*r.Anchor)
		out.Anchor = &a
	}
	return out
}
