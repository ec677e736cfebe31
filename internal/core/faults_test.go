package core

import "github.com/molt-sh/molt/internal/meta"

// stored drops the failed checkpoints from a list.
func stored(cks []meta.Checkpoint) []meta.Checkpoint {
	var out []meta.Checkpoint
	for _, c := range cks {
		if !c.Failed {
			out = append(out, c)
		}
	}
	return out
}
