// Package procmem reads, while a process runs, the pages of its memory
// a checkpoint would dump: the present (or swapped) pages of its private
// mappings that are its own (anonymous, or a private file mapping's
// written pages), as /proc/PID/pagemap tells them. A store that is sent
// those pages ahead of a checkpoint (a migration's pre-copy) then finds
// most of the checkpoint's pages known by their hashes.
//
// Everything read here is the process's: a page's bytes are only ever
// hashed and stored, and of the maps file only the addresses, the
// permissions and whether a name starts with "[" count. A process that
// names a file like a special mapping only has that file's pages left
// out of what is sent ahead.
package procmem

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
)

// PageSize is the size of the pages read.
const PageSize = 4096

// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent = 1 << 63
	pmSwapped = 1 << 62
	pmFile    = 1 << 61 // file-page or shared-anon
)

// Stats describes one read of a process's pages.
type Stats struct {
	Mappings int   // private mappings looked at
	Pages    int64 // pages read
	Skipped  int64 // pages selected that could not be read
}

// A mapping is one line of /proc/PID/maps: its range, whether it is
// private, and whether the kernel named it as a special one ([vvar]
// and the like, which a checkpoint does not dump as pages).
type mapping struct {
	start, end uint64
	private    bool
	special    bool
}

// maxMaps bounds the maps file read (a process with a million mappings).
const maxMaps = 128 << 20

// mappings parses /proc/PID/maps: "start-end perms offset dev inode
// [name]". Only the first five fields and whether a name starts with
// "[" are used.
func mappings(pid int) ([]mapping, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(io.LimitReader(f, maxMaps))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := bytes.Fields(sc.Bytes())
		if len(fields) < 5 {
			return nil, fmt.Errorf("maps of %d: a line of %d fields", pid, len(fields))
		}
		lo, hi, ok := bytes.Cut(fields[0], []byte("-"))
		if !ok {
			return nil, fmt.Errorf("maps of %d: range %q", pid, fields[0])
		}
		start, err1 := strconv.ParseUint(string(lo), 16, 64)
		end, err2 := strconv.ParseUint(string(hi), 16, 64)
		if err1 != nil || err2 != nil || end <= start || start%PageSize != 0 || end%PageSize != 0 {
			return nil, fmt.Errorf("maps of %d: range %q", pid, fields[0])
		}
		perms := fields[1]
		m := mapping{start: start, end: end, private: len(perms) == 4 && perms[3] == 'p'}
		if len(fields) >= 6 && fields[5][0] == '[' && !bytes.HasPrefix(fields[5], []byte("[heap")) &&
			!bytes.HasPrefix(fields[5], []byte("[stack")) && !bytes.HasPrefix(fields[5], []byte("[anon")) {
			m.special = true
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// scanPages is how many pagemap entries are read at once: 64 MiB of
// address space per 128 KiB read.
const scanPages = 16 << 10

// Pages calls fn with runs of process pid's own pages (see the package
// comment), each run at most len(buf) bytes (a multiple of PageSize),
// read into buf. A run the process unmapped meanwhile is skipped. fn's
// error ends the read, as ctx's end does: a process that maps terabytes
// of address space it never touches costs a scan of their pagemap
// entries, which the caller bounds in time.
func Pages(ctx context.Context, pid int, buf []byte, fn func(b []byte) error) (Stats, error) {
	var st Stats
	if len(buf) < PageSize {
		return st, errors.New("procmem: buffer smaller than a page")
	}
	buf = buf[:len(buf)/PageSize*PageSize]
	maps, err := mappings(pid)
	if err != nil {
		return st, err
	}
	dir := "/proc/" + strconv.Itoa(pid)
	pm, err := os.Open(dir + "/pagemap")
	if err != nil {
		return st, err
	}
	defer pm.Close()
	mem, err := os.Open(dir + "/mem")
	if err != nil {
		return st, err
	}
	defer mem.Close()
	maxRun := uint64(len(buf) / PageSize)
	ents := make([]byte, 8*scanPages)
	for _, m := range maps {
		if !m.private || m.special {
			continue
		}
		st.Mappings++
		for at := m.start; at < m.end; {
			if err := ctx.Err(); err != nil {
				return st, err
			}
			n := min((m.end-at)/PageSize, scanPages)
			e := ents[:8*n]
			if _, err := pm.ReadAt(e, int64(at/PageSize*8)); err != nil {
				break // unmapped meanwhile, or beyond what pagemap covers
			}
			// Runs of selected pages within these n, each at most
			// maxRun pages.
			for i := uint64(0); i < n; {
				if !own(e, i) {
					i++
					continue
				}
				j := i + 1
				for j < n && j-i < maxRun && own(e, j) {
					j++
				}
				b := buf[:(j-i)*PageSize]
				if _, err := mem.ReadAt(b, int64(at+i*PageSize)); err != nil {
					st.Skipped += int64(j - i)
				} else {
					st.Pages += int64(j - i)
					if err := fn(b); err != nil {
						return st, err
					}
				}
				i = j
			}
			at += n * PageSize
		}
	}
	return st, nil
}

// own reports whether pagemap entry i of e is a page of the process's
// own: present or swapped, and not a file's page or shared memory.
func own(e []byte, i uint64) bool {
	v := binary.LittleEndian.Uint64(e[8*i:])
	return v&(pmPresent|pmSwapped) != 0 && v&pmFile == 0
}
