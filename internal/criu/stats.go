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

// readStats decodes CRIU's statistics image dir/name (one StatsEntry).
func readStats(dir, name string) (*stats.StatsEntry, error) {
	st := &stats.StatsEntry{}
	if err := readHead(filepath.Join(dir, name), stats.StatsMagic, st); err != nil {
		return nil, err
	}
	return st, nil
}

// CRIU's leading image magics (criu/include/magic.h): images of the
// process tree start with the common one, statistics and other service
// images with the service one.
const (
	imgCommonMagic  = 0x54564319
	imgServiceMagic = 0x55105940
)

// readHead decodes the first entry of the CRIU image at path into m: a
// leading common or service magic, the image's own magic, a 32-bit
// little-endian size and the entry. Unlike go-criu's helpers it checks
// the sizes, so a truncated file is an error and not a panic.
func readHead(path string, magic uint32, m proto.Message) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if len(b) < 12 {
		return fmt.Errorf("%s: short file", path)
	}
	lead, own := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
	if (lead != imgCommonMagic && lead != imgServiceMagic) || own != magic {
		return fmt.Errorf("%s: not a CRIU image of magic %#x (magics %#x %#x)", path, magic, lead, own)
	}
	n := int(binary.LittleEndian.Uint32(b[8:]))
	if n > len(b)-12 {
		return fmt.Errorf("%s: short file", path)
	}
	if err := proto.Unmarshal(b[12:12+n], m); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
