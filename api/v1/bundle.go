package v1

// CheckpointImport is the result of a checkpoint import.
type CheckpointImport struct {
	Checkpoint Checkpoint `json:"checkpoint"`
	// What the bundle held.
	Objects     int   `json:"objects"`
	ObjectBytes int64 `json:"object_bytes"`
	FSEntries   int64 `json:"fs_entries"`
	FSBytes     int64 `json:"fs_bytes"`
	// Molt and CRIU are the versions that wrote the bundle.
	Molt       string  `json:"molt,omitempty"`
	CRIU       string  `json:"criu,omitempty"`
	DurationMS float64 `json:"duration_ms"`
}
