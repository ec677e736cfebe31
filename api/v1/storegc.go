package v1

import (
	"errors"
	"time"
)

// StoreGCRequest runs a garbage collection over the daemon's object
// store (POST /v1/store/gc; the host admin's): docs/storage.md, "Garbage
// collection".
type StoreGCRequest struct {
	// GraceSeconds is how long an object nothing names stays condemned
	// before it is deleted (0: an hour; at least 60).
	GraceSeconds int64 `json:"grace_seconds,omitempty"`
	// DryRun reports what would go and changes nothing.
	DryRun bool `json:"dry_run,omitempty"`
}

// DefaultStoreGCGrace is the grace period of a request without one.
const DefaultStoreGCGrace = time.Hour

// Grace is the request's grace period.
func (r StoreGCRequest) Grace() time.Duration {
	if r.GraceSeconds == 0 {
		return DefaultStoreGCGrace
	}
	return time.Duration(r.GraceSeconds) * time.Second
}

// Validate bounds the grace period.
func (r StoreGCRequest) Validate() error {
	if r.GraceSeconds != 0 && (r.GraceSeconds < 60 || r.GraceSeconds > 365*24*3600) {
		return errors.New("grace_seconds: from 60 to a year")
	}
	return nil
}

// StoreGCReport says what a garbage collection found and did.
type StoreGCReport struct {
	// Recipes and Sandboxes are the roots read; Packs the packs found,
	// of which LivePacks are named.
	Recipes   int `json:"recipes"`
	Sandboxes int `json:"sandboxes"`
	Packs     int `json:"packs"`
	// Condemned were newly found named by nothing; Waiting were found
	// so by an earlier run, within the grace period; Revived were
	// condemned and are named again.
	Condemned int `json:"condemned"`
	Waiting   int `json:"waiting"`
	Revived   int `json:"revived"`
	// DeletedPacks and DeletedHistory were deleted (with DryRun: would
	// be), DeletedBytes their size.
	DeletedPacks   int   `json:"deleted_packs"`
	DeletedHistory int   `json:"deleted_history"`
	DeletedBytes   int64 `json:"deleted_bytes"`
	// Generation numbers the run (gc.json in the store).
	Generation int64 `json:"generation"`
	DryRun     bool  `json:"dry_run,omitempty"`
}

// TrustKeyRequest asks a host to trust another's key (POST
// /v1/host/trusted-keys; the host admin's): PublicKey is the other
// host's host.pub, as GET /v1/host reports it.
type TrustKeyRequest struct {
	PublicKey string `json:"public_key"`
}

// TrustedKey is a key the host trusts: Added says it did not before.
type TrustedKey struct {
	KeyID string `json:"key_id"`
	Added bool   `json:"added"`
}
