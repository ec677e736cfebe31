package core

import (
	"encoding/json"
	"strings"

	"github.com/molt-sh/molt/internal/meta"
)

// The record buckets, typed (meta/records.go).
var (
	sandboxRecs    = meta.SandboxRecords
	checkpointRecs = meta.CheckpointRecords
)

// indexes find records by what references name them with, reading only
// the records that match: a sandbox's checkpoints, the checkpoints that
// carry a label, a sandbox by name. Raise an index's version when what
// it computes changes: the store rebuilds it from the records.
type indexes struct {
	ckBySandbox, ckByLabel, sbByName *meta.Index
}

func addIndexes(db *meta.DB) (indexes, error) {
	var ix indexes
	var err error
	field := func(f func(refFields) string) func([]byte) ([]string, error) {
		return func(raw []byte) ([]string, error) {
			var r refFields
			if err := json.Unmarshal(raw, &r); err != nil {
				return nil, err
			}
			if v := f(r); v != "" {
				return []string{v}, nil
			}
			return nil, nil
		}
	}
	if ix.ckBySandbox, err = db.AddIndex(meta.Checkpoints, "sandbox", 1, field(func(r refFields) string { return r.Sandbox })); err != nil {
		return ix, err
	}
	if ix.ckByLabel, err = db.AddIndex(meta.Checkpoints, "label", 1, field(func(r refFields) string { return r.Label })); err != nil {
		return ix, err
	}
	if ix.sbByName, err = db.AddIndex(meta.Sandboxes, "name", 1, field(func(r refFields) string { return r.Name })); err != nil {
		return ix, err
	}
	return ix, nil
}

// refFields are the fields of a record that the indexes read (JSON
// names of meta.Checkpoint and meta.Sandbox).
type refFields struct {
	Sandbox string `json:"sandbox"`
	Label   string `json:"label"`
	Name    string `json:"name"`
}

// byIDPrefix returns the records of b whose key starts with prefix, in
// key order (IDs are the keys).
func byIDPrefix[T any](db *meta.DB, b meta.Bucket[T], prefix string) ([]T, error) {
	var out []T
	err := db.ForEachPrefix(string(b), prefix, func(_ string, raw []byte) error {
		var v T
		if err := meta.Unmarshal(raw, &v); err != nil {
			return err
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

// minPrefix is the shortest ID prefix a reference may be.
const minPrefix = 4

func isPrefixRef(ref string) bool { return len(ref) >= minPrefix && !strings.ContainsRune(ref, 0) }
