package v1

import "time"

// Tenant owns sandboxes and their checkpoints, turn logs and ledgers.
type Tenant struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
}

// TenantCreateRequest makes a tenant.
type TenantCreateRequest struct {
	Name string `json:"name"`
}

// TokenCreateRequest makes an API token of a tenant.
type TokenCreateRequest struct {
	Tenant string `json:"tenant"`
	// Scopes: read, exec, checkpoint, rollback, admin (admin implies the
	// others); none means read, exec, checkpoint and rollback.
	Scopes []string `json:"scopes,omitempty"`
	// Sandboxes, if any, are the only sandboxes the token reaches.
	Sandboxes []string `json:"sandboxes,omitempty"`
	Note      string   `json:"note,omitempty"`
}

// Token is an API token's record. Secret is set only in the answer that
// made it: the daemon keeps its hash, never the token.
type Token struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	Scopes    []string  `json:"scopes"`
	Sandboxes []string  `json:"sandboxes,omitempty"`
	Note      string    `json:"note,omitempty"`
	Created   time.Time `json:"created"`
	Secret    string    `json:"token,omitempty"`
}

// DataKey describes one tenant data key of encryption at rest (never
// its material): Tenant "" is the host's own sandboxes.
type DataKey struct {
	Tenant string `json:"tenant"`
	ID     string `json:"id"`
	// KEK is the ID of the key-encryption key that wraps it.
	KEK string `json:"kek"`
	// Current: the key new data of the tenant is sealed with.
	Current bool      `json:"current"`
	Created time.Time `json:"created"`
}

// DataKeyRequest names the tenant of a key rotation or shredding.
type DataKeyRequest struct {
	Tenant string `json:"tenant"`
}

// ShredResult reports a shredding: how many keys were deleted.
type ShredResult struct {
	Tenant   string `json:"tenant"`
	Shredded int    `json:"shredded"`
}
