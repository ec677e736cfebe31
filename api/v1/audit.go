package v1

import "time"

// AuditEntry is one line of the daemon's audit log, as GET /v1/audit
// streams them (JSON lines, in seq order). The hash rule and what each
// kind records are in docs/security.md, "Audit log"; verify a stream with
// `molt audit verify FILE`, not by re-encoding it: the hash covers the
// line's bytes as sent.
type AuditEntry struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	Prev string    `json:"prev"`
	Kind string    `json:"kind"` // api, effect, segment

	Actor      *AuditActor `json:"actor,omitempty"`
	Route      string      `json:"route,omitempty"`
	Path       string      `json:"path,omitempty"`
	Sandbox    string      `json:"sandbox,omitempty"`
	Checkpoint string      `json:"checkpoint,omitempty"`
	Effect     string      `json:"effect,omitempty"`
	Image      string      `json:"image,omitempty"`
	Session    string      `json:"session,omitempty"`
	Status     int         `json:"status,omitempty"`
	Error      string      `json:"error,omitempty"`
	DurationUS int64       `json:"duration_us,omitempty"`

	EffectKind string `json:"effect_kind,omitempty"`
	State      string `json:"state,omitempty"`
	Method     string `json:"method,omitempty"`
	Host       string `json:"host,omitempty"`
	URLPath    string `json:"url_path,omitempty"`

	Note string `json:"note,omitempty"`
	Hash string `json:"hash"`
}

// AuditActor is who made an API request: the unix socket peer's
// credentials.
type AuditActor struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	PID int32  `json:"pid"`
}

// AuditHead names an entry of the audit log.
type AuditHead struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

// AuditVerifyResult is what POST /v1/audit/verify (or `molt audit verify
// FILE`) found.
type AuditVerifyResult struct {
	OK       bool      `json:"ok"`
	Entries  int       `json:"entries"`
	FirstSeq uint64    `json:"first_seq,omitempty"`
	Head     AuditHead `json:"head"` // the last good entry
	// Anchor is the (seq, hash) the log was checked against for a cut
	// tail; nil when there was none.
	Anchor *AuditHead `json:"anchor,omitempty"`
	// Partial: the entries start after seq 1 (an export with --since).
	Partial bool `json:"partial,omitempty"`
	// Segment: the log is a segment started after damage; this is its
	// first entry's note.
	Segment string `json:"segment,omitempty"`
	// For a failure: the first bad seq, its line (1-based) and what is
	// wrong.
	BadSeq  uint64 `json:"bad_seq,omitempty"`
	BadLine int    `json:"bad_line,omitempty"`
	Problem string `json:"problem,omitempty"`
	// File is the log verified (the daemon's, or the one given).
	File string `json:"file,omitempty"`
}
