package core

import v1 "github.com/molt-sh/molt/api/v1"

// stored drops the failed checkpoints from a list.
func stored(cks []v1.Checkpoint) []v1.Checkpoint {
	var out []v1.Checkpoint
	for _, c := range cks {
		if !c.Failed {
			out = append(out, c)
		}
	}
	return out
}
