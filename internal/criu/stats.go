package criu

import (
	"path/filepath"

	"github.com/checkpoint-restore/go-criu/v7/stats"
)

const (
	statsDump    = stats.StatsDump
	statsRestore = stats.StatsRestore
)

// readStats decodes CRIU's statistics image dir/name (one StatsEntry).
func readStats(dir, name string) (*stats.StatsEntry, error) {
	st := &stats.StatsEntry{}
	if err := readHead(filepath.Join(dir, name), stats.StatsMagic, st); err != nil {
		return nil, err
	}
	return st, nil
}
