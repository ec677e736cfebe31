package audit

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Anchor keeps the latest durable (seq, hash) of the log somewhere other
// than the log, so that cutting entries from the log's tail is detected
// (package doc: what it does and does not protect against).
type Anchor interface {
	// Load returns the head last stored; ok is false when there is none.
	Load() (h Head, ok bool, err error)
	// Store records h, a later entry of the same segment than the head
	// stored before; durable when it returns.
	Store(h Head) error
	// Reset records h as the head of a new segment (seq may go down).
	Reset(h Head) error
}

// FileAnchor is an Anchor in a file of two fixed-size slots, written in
// turn with pwrite and fdatasync: a write torn by a crash spoils one
// slot and Load takes the other. Each slot is one line
//
//	molt-audit-anchor v1 <epoch> <seq> <hash> <crc32c of what precedes, 8 hex>
//
// padded with NULs to anchorSlot bytes; the epoch counts Resets, and
// Load takes the valid slot with the highest (epoch, seq).
type FileAnchor struct {
	Path string // +checklocksignore: set before first use

	mu sync.Mutex
	f  *os.File // +checklocks:mu
	// loaded: epoch and next were read from the file.
	loaded bool   // +checklocks:mu
	epoch  uint64 // +checklocks:mu
	next   int    // +checklocks:mu
}

const anchorSlot = 160

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type slot struct {
	epoch uint64
	h     Head
}

// +checklocks:a.mu
func (a *FileAnchor) open() error {
	if a.f != nil {
		return nil
	}
	_, err := os.Stat(a.Path)
	created := errors.Is(err, os.ErrNotExist)
	f, err := os.OpenFile(a.Path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("audit anchor: %w", err)
	}
	if created {
		// The name must survive a host crash as the slots do.
		if err := syncDir(filepath.Dir(a.Path)); err != nil {
			f.Close()
			return fmt.Errorf("audit anchor: %w", err)
		}
	}
	a.f = f
	return nil
}

// Load implements Anchor.
func (a *FileAnchor) Load() (Head, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.load()
}

// +checklocks:a.mu
func (a *FileAnchor) load() (Head, bool, error) {
	a.loaded = true
	if _, err := os.Stat(a.Path); errors.Is(err, os.ErrNotExist) {
		return Head{}, false, nil
	}
	if err := a.open(); err != nil {
		return Head{}, false, err
	}
	buf := make([]byte, 2*anchorSlot)
	n, err := a.f.ReadAt(buf, 0)
	if err != nil && err != io.EOF {
		return Head{}, false, fmt.Errorf("audit anchor: %w", err)
	}
	if n == 0 {
		return Head{}, false, nil
	}
	best, at, ok := parseSlots(buf[:n])
	if !ok {
		return Head{}, false, fmt.Errorf("audit anchor %s: no valid slot", a.Path)
	}
	a.epoch, a.next = best.epoch, 1-at
	return best.h, true, nil
}

// ReadAnchorFile reads a FileAnchor's head without writing to it (an
// offline verification).
func ReadAnchorFile(path string) (Head, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Head{}, fmt.Errorf("audit anchor: %w", err)
	}
	s, _, ok := parseSlots(b)
	if !ok {
		return Head{}, fmt.Errorf("audit anchor %s: no valid slot", path)
	}
	return s.h, nil
}

// parseSlots returns the valid slot with the highest (epoch, seq) and its
// index.
func parseSlots(buf []byte) (slot, int, bool) {
	var best slot
	at, found := 0, false
	for i := 0; i < 2 && len(buf) >= (i+1)*anchorSlot; i++ {
		s, ok := parseSlot(buf[i*anchorSlot : (i+1)*anchorSlot])
		if ok && (!found || s.epoch > best.epoch || s.epoch == best.epoch && s.h.Seq > best.h.Seq) {
			best, at, found = s, i, true
		}
	}
	return best, at, found
}

func parseSlot(b []byte) (slot, bool) {
	b, _, _ = bytes.Cut(b, []byte{'\n'})
	i := bytes.LastIndexByte(b, ' ')
	if i < 0 {
		return slot{}, false
	}
	crc, err := strconv.ParseUint(string(b[i+1:]), 16, 32)
	if err != nil || crc32.Checksum(b[:i], castagnoli) != uint32(crc) {
		return slot{}, false
	}
	f := strings.Fields(string(b[:i]))
	if len(f) != 5 || f[0] != "molt-audit-anchor" || f[1] != "v1" || !isHex(f[4]) {
		return slot{}, false
	}
	ep, err1 := strconv.ParseUint(f[2], 10, 64)
	seq, err2 := strconv.ParseUint(f[3], 10, 64)
	if err1 != nil || err2 != nil {
		return slot{}, false
	}
	return slot{epoch: ep, h: Head{Seq: seq, Hash: f[4]}}, true
}

// +checklocks:a.mu
func (a *FileAnchor) write(h Head) error {
	if !a.loaded {
		if _, _, err := a.load(); err != nil {
			// An unreadable anchor is overwritten: the caller has
			// reported it (Log.Open).
			a.epoch++
		}
	}
	if err := a.open(); err != nil {
		return err
	}
	text := fmt.Sprintf("molt-audit-anchor v1 %d %d %s", a.epoch, h.Seq, h.Hash)
	line := fmt.Appendf(nil, "%s %08x\n", text, crc32.Checksum([]byte(text), castagnoli))
	buf := make([]byte, anchorSlot)
	copy(buf, line)
	if _, err := a.f.WriteAt(buf, int64(a.next*anchorSlot)); err != nil {
		return fmt.Errorf("audit anchor: %w", err)
	}
	if err := unix.Fdatasync(int(a.f.Fd())); err != nil {
		return fmt.Errorf("audit anchor: fdatasync: %w", err)
	}
	a.next = 1 - a.next
	return nil
}

// Store implements Anchor.
func (a *FileAnchor) Store(h Head) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.write(h)
}

// Reset implements Anchor.
func (a *FileAnchor) Reset(h Head) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.loaded {
		if _, _, err := a.load(); err != nil {
			a.epoch++
		}
	}
	a.epoch++
	return a.write(h)
}

// Close closes the file.
func (a *FileAnchor) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return nil
	}
	err := a.f.Close()
	a.f = nil
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
