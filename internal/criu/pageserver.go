package criu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
)

// PageSize is the size of the pages CRIU's page images hold.
const PageSize = pageSize

// A PageRun is Pages consecutive pages of a dumped tree's memory from
// Vaddr whose bytes are pages Index.. of page image Image
// ("pages-N.img"). Lazy runs may be restored on demand (private
// anonymous memory); the restore itself reads the others.
type PageRun struct {
	Vaddr uint64
	Pages uint64
	Image string
	Index uint64
	Lazy  bool
}

// A PageMap is where the pages of a dumped tree are: the runs of each
// task's pagemap (pagemap-PID.img), and those of shared memory
// (pagemap-shmem-ID.img), which a restore always reads itself.
type PageMap struct {
	tasks  map[uint64][]PageRun // by pid, by Vaddr
	shared []PageRun
	sizes  map[string]uint64 // pages per page image, as the pagemaps count them
}

var pagemapName = regexp.MustCompile(`^pagemap-(shmem-)?(\d+)\.img$`)

// maxPageRuns bounds the runs read from one images directory.
const maxPageRuns = 1 << 22

// ReadPageMap reads the pagemaps of the images in dir. The images are
// the dumped tree's, so they are not trusted: runs of a task must not
// overlap, and no size may overflow.
func ReadPageMap(dir string) (*PageMap, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	pm := &PageMap{tasks: map[uint64][]PageRun{}, sizes: map[string]uint64{}}
	runs := 0
	for _, e := range ents {
		m := pagemapName.FindStringSubmatch(e.Name())
		if m == nil || !e.Type().IsRegular() {
			continue
		}
		id, err := strconv.ParseUint(m[2], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		rs, err := pm.read(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		if runs += len(rs); runs > maxPageRuns {
			return nil, fmt.Errorf("%s: more than %d page runs", dir, maxPageRuns)
		}
		if m[1] != "" {
			pm.shared = append(pm.shared, rs...)
			continue
		}
		sort.Slice(rs, func(i, j int) bool { return rs[i].Vaddr < rs[j].Vaddr })
		for i := 1; i < len(rs); i++ {
			if rs[i-1].Vaddr+rs[i-1].Pages*PageSize > rs[i].Vaddr {
				return nil, fmt.Errorf("%s: runs at %#x and %#x overlap", e.Name(), rs[i-1].Vaddr, rs[i].Vaddr)
			}
		}
		pm.tasks[id] = rs
	}
	return pm, nil
}

// read returns the present runs of the pagemap at path and counts their
// pages in pm.sizes.
func (pm *PageMap) read(path string) ([]PageRun, error) {
	ents, err := decodeEntries(path, uint32(magics.ByName["PAGEMAP"]), 0, pagemapMsg, nil)
	if err != nil {
		return nil, err
	}
	if len(ents) == 0 {
		return nil, fmt.Errorf("%s: no head", path)
	}
	image := fmt.Sprintf("pages-%d.img", ents[0].msg.(*pagemap.PagemapHead).GetPagesId())
	next := pm.sizes[image]
	var out []PageRun
	for i, e := range ents[1:] {
		pe := e.msg.(*pagemap.PagemapEntry)
		flags := pe.GetFlags()
		if pe.GetInParent() {
			flags |= pageParent
		} else if pe.Flags == nil {
			flags = pagePresent
		}
		n := nrPages(pe)
		if flags&pagePresent == 0 {
			if flags&pageParent != 0 {
				return nil, fmt.Errorf("%s: entry %d: pages in a parent image", path, i+1)
			}
			continue
		}
		if pe.GetVaddr()%PageSize != 0 || n == 0 || pe.GetVaddr() >= userTop || n > (userTop-pe.GetVaddr())/PageSize {
			return nil, fmt.Errorf("%s: entry %d: %d pages at %#x", path, i+1, n, pe.GetVaddr())
		}
		out = append(out, PageRun{Vaddr: pe.GetVaddr(), Pages: n, Image: image, Index: next, Lazy: flags&pageLazy != 0})
		next += n
		if next > 1<<40 {
			return nil, fmt.Errorf("%s: too many pages", path)
		}
	}
	pm.sizes[image] = next
	return out, nil
}

// Pages returns the number of pages each page image holds, as the
// pagemaps count them.
func (pm *PageMap) Pages() map[string]uint64 { return pm.sizes }

// Eager returns the runs a lazy restore reads itself: every run that is
// not lazy, shared memory included.
func (pm *PageMap) Eager() []PageRun {
	var out []PageRun
	for _, rs := range pm.tasks {
		for _, r := range rs {
			if !r.Lazy {
				out = append(out, r)
			}
		}
	}
	return append(out, pm.shared...)
}

// Lazy returns the runs a lazy restore leaves to the lazy-pages daemon.
func (pm *PageMap) Lazy() []PageRun {
	var out []PageRun
	for _, rs := range pm.tasks {
		for _, r := range rs {
			if r.Lazy {
				out = append(out, r)
			}
		}
	}
	return out
}

// Find returns where the n pages of task pid from vaddr are: they must
// lie in one run.
func (pm *PageMap) Find(pid, vaddr, n uint64) (image string, index uint64, ok bool) {
	rs := pm.tasks[pid]
	i := sort.Search(len(rs), func(i int) bool { return rs[i].Vaddr+rs[i].Pages*PageSize > vaddr })
	if i == len(rs) || vaddr < rs[i].Vaddr || vaddr%PageSize != 0 || n == 0 {
		return "", 0, false
	}
	r := rs[i]
	off := (vaddr - r.Vaddr) / PageSize
	if n > r.Pages-off {
		return "", 0, false
	}
	return r.Image, r.Index + off, true
}

// Page server protocol (criu/page-xfer.c): a lazy-pages daemon sends
// requests of this layout (with the C struct's padding after cmd) and
// gets back the same header with cmd PS_IOV_ADD_F|PE_PRESENT<<16 and
// the pages, or nr_pages 0 for pages the server does not have; it ends
// with PS_IOV_CLOSE, answered by a 32-bit status.
const (
	psIovAddF  = 6
	psIovGet   = 7
	psIovClose = 0x1023
	psIovForce = 0x1024
	psCmdBits  = 16
	psiSize    = 32
)

// PageSource reads n pages of page image image from page index into
// buf (n*PageSize bytes).
type PageSource func(image string, index uint64, n int, buf []byte) error

// maxServePages bounds one request's pages (CRIU asks for 4 MiB at
// most: MAX_XFER_LEN).
const maxServePages = 4096

// ServePages answers a lazy-pages daemon on conn with the pages of pm,
// read through src, until the daemon says it is done (nil) or conn or
// src fails. A request for pages pm has no lazy run for is answered
// with none, which ends the daemon's restore.
func ServePages(conn io.ReadWriter, pm *PageMap, src PageSource) error {
	var hdr [psiSize]byte
	buf := make([]byte, 0, 64*PageSize)
	for {
		if _, err := io.ReadFull(conn, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("page server: read a request: %w", err)
		}
		cmd := binary.LittleEndian.Uint32(hdr[0:])
		n := binary.LittleEndian.Uint64(hdr[8:])
		vaddr := binary.LittleEndian.Uint64(hdr[16:])
		pid := binary.LittleEndian.Uint64(hdr[24:])
		switch cmd & (1<<psCmdBits - 1) {
		case psIovClose & (1<<psCmdBits - 1), psIovForce & (1<<psCmdBits - 1):
			var status [4]byte
			_, err := conn.Write(status[:])
			return err
		case psIovGet:
		default:
			return fmt.Errorf("page server: unknown request %#x", cmd)
		}
		image, index, ok := pm.Find(pid, vaddr, n)
		if !ok || n > maxServePages {
			binary.LittleEndian.PutUint32(hdr[0:], psIovAddF|pagePresent<<psCmdBits)
			binary.LittleEndian.PutUint64(hdr[8:], 0)
			if _, err := conn.Write(hdr[:]); err != nil {
				return err
			}
			return fmt.Errorf("page server: task %d has no %d pages at %#x", pid, n, vaddr)
		}
		size := int(n) * PageSize
		if cap(buf) < psiSize+size {
			buf = make([]byte, 0, psiSize+size)
		}
		b := buf[:psiSize+size]
		if err := src(image, index, int(n), b[psiSize:]); err != nil {
			// The daemon is told nothing more: it cannot be given wrong
			// pages, and zero pages would end it the same way.
			return fmt.Errorf("page server: task %d, %d pages at %#x (%s from page %d): %w", pid, n, vaddr, image, index, err)
		}
		binary.LittleEndian.PutUint32(b[0:], psIovAddF|pagePresent<<psCmdBits)
		binary.LittleEndian.PutUint32(b[4:], 0)
		copy(b[8:psiSize], hdr[8:])
		if _, err := conn.Write(b); err != nil {
			return fmt.Errorf("page server: %w", err)
		}
	}
}
