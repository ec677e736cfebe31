package criu

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"

	"github.com/checkpoint-restore/go-criu/v7/stats"
	"google.golang.org/protobuf/proto"
)

const (
	statsDump    = stats.StatsDump
	statsRestore = stats.StatsRestore
)

// readStats decodes CRIU's statistics image dir/name: two magics, a
// payload size and one StatsEntry. Unlike go-criu's helper it checks the
// sizes, so a truncated file is an error and not a panic.
func readStats(dir, name string) (*stats.StatsEntry, error) {
	path := filepath.Join(dir, name)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) < stats.PayloadOffset {
		return nil, fmt.Errorf("%s: short file", path)
	}
	if binary.LittleEndian.Uint32(b[stats.PrimaryMagicOffset:]) != stats.ImgServiceMagic ||
		binary.LittleEndian.Uint32(b[stats.SecondaryMagicOffset:]) != stats.StatsMagic {
		return nil, fmt.Errorf("%s: not a CRIU statistics image", path)
	}
	n := int(binary.LittleEndian.Uint32(b[stats.SizeOffset:]))
	if n > len(b)-stats.PayloadOffset {
		return nil, fmt.Errorf("%s: short file", path)
	}
	st := &stats.StatsEntry{}
	if err := proto.Unmarshal(b[stats.PayloadOffset:stats.PayloadOffset+n], st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}
