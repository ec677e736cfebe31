package v1

import "errors"

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
}

// Validate bounds a resume request.
func (r ResumeRequest) Validate() error {
	if r.Handover != nil && len(r.Handover.EgressCAKey) > 64<<10 {
		return errors.New("handover: egress_ca_key: over 64 KiB")
	}
	return nil
}
