package v1

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// MigrateRequest moves a running sandbox to another daemon sharing the
// object store (POST /v1/sandboxes/{id}/migrate; the host admin's).
type MigrateRequest struct {
	// To is the target daemon's TCP API, "https://HOST:PORT".
	To string `json:"to"`
	// Token is a token of the sandbox's tenant on the target, with the
	// checkpoint scope.
	Token string `json:"token"`
	// CAPEM, if set, is the PEM CA the target's certificate must chain
	// to (else the system's roots).
	CAPEM string `json:"ca_pem,omitempty"`
}

// MigrateResult reports a migration.
type MigrateResult struct {
	Sandbox string `json:"sandbox"`
	Target  string `json:"target"`
	// Checkpoint is the final checkpoint, taken here and resumed there;
	// Checkpoints counts those the target can roll back to.
	Checkpoint  string `json:"checkpoint"`
	Checkpoints int    `json:"checkpoints"`
	// DowntimeMS is from the final checkpoint's start to the target's
	// answer that the sandbox runs; UploadMS and ResumeMS are its parts
	// for the store's upload and the target's resume.
	DowntimeMS float64 `json:"downtime_ms"`
	UploadMS   float64 `json:"upload_ms"`
	ResumeMS   float64 `json:"resume_ms"`
	// PrecopyMS is the time spent, before the final checkpoint and while
	// the sandbox ran, sending the store the pages of its memory it
	// lacked; PrecopySentBytes is what that sent.
	PrecopyMS        float64 `json:"precopy_ms"`
	PrecopySentBytes int64   `json:"precopy_sent_bytes"`
	// LLMEndpoint is the sandbox's LLM endpoint on the target, with its
	// token (the one it had here): give the agent this URL. Nil if the
	// sandbox had none, or if it could not be moved (Note says why).
	LLMEndpoint *LLMEndpoint `json:"llm_endpoint,omitempty"`
	// Note says what did not move, if anything.
	Note string `json:"note,omitempty"`
}

// ResumeRequest is the optional body of POST /v1/sandboxes/{id}/resume.
type ResumeRequest struct {
	// Handover is what a migration's source daemon gives the target with
	// the resume, over their TLS channel: what must move with the
	// sandbox but never goes to the object store.
	Handover *Handover `json:"handover,omitempty"`
}

// Handover: see ResumeRequest.
type Handover struct {
	// EgressCAKey is the PEM private key of the sandbox's TLS inspection
	// CA (egress with inspection). The target takes it only if it
	// matches the certificate in the store's signed record of the
	// sandbox, and only when it adopts the sandbox from the store.
	EgressCAKey string `json:"egress_ca_key,omitempty"`
	// Names are what the sandbox resolved through the source's DNS
	// (egress), which the target judges the sandbox's connections by
	// until they expire, as the source did. The source host signs them
	// (NamesKey, its key's name, and NamesSignature, base64 ed25519 over
	// "molt-names-v1\0", the sandbox's ID, "\0" and the JSON of Names):
	// the target takes them only signed by the host that signed the
	// sandbox's document in the store.
	Names          []ResolvedName `json:"names,omitempty"`
	NamesKey       string         `json:"names_key,omitempty"`
	NamesSignature string         `json:"names_signature,omitempty"`
}

// ResolvedName is a name a sandbox resolved to an address, remembered
// until Expires.
type ResolvedName struct {
	Name    string    `json:"name"`
	Addr    string    `json:"addr"`
	Expires time.Time `json:"expires"`
}

// MaxHandoverNames bounds the names a handover carries.
const MaxHandoverNames = 16384

// Validate bounds a resume request.
func (r ResumeRequest) Validate() error {
	h := r.Handover
	if h == nil {
		return nil
	}
	if len(h.EgressCAKey) > 64<<10 {
		return errors.New("handover: egress_ca_key: over 64 KiB")
	}
	if len(h.Names) > MaxHandoverNames {
		return fmt.Errorf("handover: %d names, at most %d", len(h.Names), MaxHandoverNames)
	}
	for _, n := range h.Names {
		if n.Name == "" || len(n.Name) > 253 {
			return fmt.Errorf("handover: name %q: empty or over 253 bytes", n.Name)
		}
		if _, err := netip.ParseAddr(n.Addr); err != nil {
			return fmt.Errorf("handover: name %s: address: %v", n.Name, err)
		}
	}
	if len(h.NamesKey) > 256 || len(h.NamesSignature) > 1024 {
		return errors.New("handover: names_key or names_signature too long")
	}
	return nil
}
