package criu

import (
	"encoding/binary"
	"fmt"
	"os"

	"github.com/checkpoint-restore/go-criu/v7/magic"
	"google.golang.org/protobuf/proto"
)

// An imageEntry is one entry of a CRIU image and the raw data that
// follows it in the file (a pipe's queued bytes), if any.
type imageEntry struct {
	msg   proto.Message
	extra []byte
}

var magics = magic.LoadMagic()

// magicOf is the magic of CRIU's image kind name ("CORE", "FILES", ...).
func magicOf(name string) (uint32, error) {
	v, ok := magics.ByName[name]
	if !ok {
		return 0, fmt.Errorf("unknown CRIU image kind %s", name)
	}
	return uint32(v), nil
}

// CRIU's leading image magics (criu/include/magic.h): images of the
// process tree start with the common one, statistics and other service
// images with the service one, and the inventory with its own magic.
const (
	imgCommonMagic  = 0x54564319
	imgServiceMagic = 0x55105940
)

// readEntries decodes the CRIU image at path of kind name ("CORE", ...):
// see decodeEntries.
func readEntries(path, name string, newEntry func(i int) proto.Message, extraLen func(proto.Message) int) ([]imageEntry, error) {
	magic, err := magicOf(name)
	if err != nil {
		return nil, err
	}
	return decodeEntries(path, magic, 0, newEntry, extraLen)
}

// readHead decodes the first entry of the CRIU image at path, whose own
// magic is magic, into m.
func readHead(path string, magic uint32, m proto.Message) error {
	ents, err := decodeEntries(path, magic, 1, func(int) proto.Message { return m }, nil)
	if err == nil && len(ents) == 0 {
		err = fmt.Errorf("%s: short file", path)
	}
	return err
}

// decodeEntries decodes the CRIU image at path: see decodeImage.
func decodeEntries(path string, magic uint32, max int, newEntry func(i int) proto.Message, extraLen func(proto.Message) int) ([]imageEntry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	ents, _, err := decodeImage(path, b, magic, max, entryBounds{}, newEntry, extraLen)
	return ents, err
}

// entryBounds bound the entries decodeImage accepts (0: no bound).
type entryBounds struct {
	size  int // bytes of one entry's message
	count int // entries of the image
}

// decodeImage decodes b, the content of the CRIU image named path: a
// leading common or service magic (the inventory has none), the image's
// own magic, then entries, each a 32-bit little-endian size and the
// message, which newEntry makes (it is told the entry's index: a
// pagemap's first entry differs from the rest), up to max of them (0:
// all; the bytes after them are returned). extraLen, if set, tells how
// many raw bytes follow an entry. Sizes are checked, so a truncated file
// is an error and not a panic (unlike go-criu's helpers); nothing is
// allocated from a size read in b.
func decodeImage(path string, b []byte, magic uint32, max int, lim entryBounds, newEntry func(i int) proto.Message, extraLen func(proto.Message) int) ([]imageEntry, []byte, error) {
	if len(b) >= 4 {
		if lead := binary.LittleEndian.Uint32(b); lead == imgCommonMagic || lead == imgServiceMagic {
			b = b[4:]
		}
	}
	if len(b) < 4 || binary.LittleEndian.Uint32(b) != magic {
		return nil, nil, fmt.Errorf("%s: not a CRIU image of magic %#x", path, magic)
	}
	return decodeFrames(path, b[4:], max, lim, newEntry, extraLen)
}

// decodeFrames decodes the entries of an image after its magic (see
// decodeImage).
func decodeFrames(path string, b []byte, max int, lim entryBounds, newEntry func(i int) proto.Message, extraLen func(proto.Message) int) ([]imageEntry, []byte, error) {
	var out []imageEntry
	for len(b) > 0 && (max == 0 || len(out) < max) {
		if lim.count > 0 && len(out) >= lim.count {
			return nil, nil, fmt.Errorf("%s: more than %d entries", path, lim.count)
		}
		if len(b) < 4 {
			return nil, nil, fmt.Errorf("%s: short file: %d trailing bytes after entry %d, too few for a size", path, len(b), len(out)-1)
		}
		n := int(binary.LittleEndian.Uint32(b))
		if lim.size > 0 && n > lim.size {
			return nil, nil, fmt.Errorf("%s: entry %d: %d bytes, over the limit of %d", path, len(out), n, lim.size)
		}
		if n > len(b)-4 {
			return nil, nil, fmt.Errorf("%s: short file: entry %d of %d bytes runs past the end (%d left)", path, len(out), n, len(b)-4)
		}
		m := newEntry(len(out))
		if err := proto.Unmarshal(b[4:4+n], m); err != nil {
			return nil, nil, fmt.Errorf("%s: entry %d: %w", path, len(out), err)
		}
		b = b[4+n:]
		e := imageEntry{msg: m}
		if extraLen != nil {
			k := extraLen(m)
			if k < 0 || k > len(b) {
				return nil, nil, fmt.Errorf("%s: short file: entry %d says %d bytes of data follow it, %d do", path, len(out), k, len(b))
			}
			e.extra, b = b[:k], b[k:]
		}
		out = append(out, e)
	}
	return out, b, nil
}

// writeEntries writes a CRIU image of kind name at path, which must not
// exist.
func writeEntries(path, name string, entries []imageEntry) error {
	own, err := magicOf(name)
	if err != nil {
		return err
	}
	var b []byte
	if name != "INVENTORY" {
		b = binary.LittleEndian.AppendUint32(b, imgCommonMagic)
	}
	b = binary.LittleEndian.AppendUint32(b, own)
	for _, e := range entries {
		m, err := proto.Marshal(e.msg)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m)))
		b = append(b, m...)
		b = append(b, e.extra...)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
