// Package pagestore stores CRIU page images by content on btrfs.
//
// Consecutive checkpoints of a sandbox differ in few memory pages, but
// CRIU writes every page on every dump (this kernel has no soft-dirty
// tracking, so CRIU's own incremental dumps do not work). Store copies a
// freshly dumped page image from staging into the pool page by page
// (4 KiB): a page whose SHA-256 an Index already knows is shared by
// reflink (FICLONERANGE) with the file that holds it; only new pages are
// written. The result is an ordinary CRIU page image, so restore reads it
// as it is, with no reassembly.
//
// Sharing is btrfs extent sharing: deleting a checkpoint's files releases
// exactly the pages no other checkpoint shares (btrfs counts extent
// references). An Index only speeds up finding copies; it is rebuilt from
// the per-image hash files and never needs to be kept consistent with
// deletions beyond dropping the files of a deleted checkpoint.
package pagestore

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// PageSize is the unit of sharing; CRIU page images are made of pages of
// this size, and btrfs shares extents at this granularity.
const PageSize = 4096

// HashSize is the size of one page hash in a hash file.
const HashSize = sha256.Size

type loc struct {
	file int32
	page int64
}

// Index maps page hashes to a file and page that hold that content.
type Index struct {
	files []string
	pages map[[HashSize]byte]loc
	small map[[HashSize]byte]string // whole files shorter than a page, by content hash
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{pages: map[[HashSize]byte]loc{}, small: map[[HashSize]byte]string{}}
}

// AddSmall indexes a whole file shorter than a page by its SHA-256 (such
// a file shares no page; it can be shared whole).
func (x *Index) AddSmall(file string, sum [HashSize]byte) {
	if _, ok := x.small[sum]; !ok {
		x.small[sum] = file
	}
}

// AddFilePages indexes the pages of file by reading and hashing it (for
// files without a hash file, such as the hash files themselves).
func (x *Index) AddFilePages(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var hashes []byte
	for off := 0; off+PageSize <= len(b); off += PageSize {
		h := sha256.Sum256(b[off : off+PageSize])
		hashes = append(hashes, h[:]...)
	}
	x.Add(file, hashes)
	return nil
}

// Len returns the number of distinct pages indexed.
func (x *Index) Len() int { return len(x.pages) }

// Add indexes the pages of file, whose page hashes (HashSize bytes per
// page, in order) are hashes.
func (x *Index) Add(file string, hashes []byte) {
	fi := int32(len(x.files))
	x.files = append(x.files, file)
	for i := 0; i+HashSize <= len(hashes); i += HashSize {
		var h [HashSize]byte
		copy(h[:], hashes[i:])
		if _, ok := x.pages[h]; !ok {
			x.pages[h] = loc{file: fi, page: int64(i / HashSize)}
		}
	}
}

// AddHashFile indexes the pages of file from its hash file.
func (x *Index) AddHashFile(file, hashFile string) error {
	b, err := os.ReadFile(hashFile)
	if err != nil {
		return err
	}
	if len(b)%HashSize != 0 {
		return fmt.Errorf("hash file %s: size %d is not a multiple of %d", hashFile, len(b), HashSize)
	}
	x.Add(file, b)
	return nil
}

// Result reports one Store.
type Result struct {
	Size    int64 // bytes in the image
	Pages   int   // pages in the image
	Shared  int   // pages shared with indexed files
	Written int64 // bytes written (new pages, and a partial last page)
	Hashes  []byte
	// Sum is the SHA-256 of the whole image, computed on the way.
	Sum      [sha256.Size]byte
	Reflinks int // FICLONERANGE calls
	// Seals are the pages' seals, in order, when a Sealer encrypted
	// them (SealSize bytes each).
	Seals []byte
}

// SealSize is the size of one page's seal (internal/keys.SealSize).
const SealSize = 28

// Sealer encrypts the pages of one image in place, each to ciphertext of
// its own length, and gives each page's seal (what decrypting it needs
// besides the key). With a Sealer, the store works on ciphertext: its
// hashes, its sharing and the image it writes are the ciphertext's, so
// a deterministic Sealer (equal pages, equal ciphertext) keeps sharing
// equal pages, and the index never holds a hash of plaintext.
type Sealer interface {
	Seal(page int64, b []byte, seal *[SealSize]byte) error
}

// Store copies the page image src to dst (a new file on the same btrfs
// filesystem as the indexed files), sharing known pages and writing new
// ones, and adds dst's pages to the index. It returns the page hashes of
// dst, to be kept in a hash file for later indexes.
func Store(src, dst string, x *Index) (Result, error) {
	return StoreWith(src, dst, x, nil)
}

// yieldEvery is how many pages StoreWith processes between calls of its
// yield function.
const yieldEvery = 256

// StoreWith is Store, calling yield (if not nil) every yieldEvery pages
// with the bytes written since its last call, and once at the end: a
// scheduler can account the I/O and pause the copy there. An error from
// yield ends the store (dst is removed).
func StoreWith(src, dst string, x *Index, yield func(written int64) error) (Result, error) {
	return StoreSealed(src, dst, x, yield, nil)
}

// StoreSealed is StoreWith, encrypting every page with s first (if not
// nil): see Sealer.
func StoreSealed(src, dst string, x *Index, yield func(written int64) error, s Sealer) (Result, error) {
	in, err := os.Open(src)
	if err != nil {
		return Result{}, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Result{}, err
	}
	ok := false
	defer func() {
		out.Close()
		if !ok {
			os.Remove(dst)
		}
	}()
	st, err := in.Stat()
	if err != nil {
		return Result{}, err
	}
	size := st.Size()
	if size < PageSize {
		return storeSmall(in, out, dst, size, x, s, &ok)
	}
	var res Result
	var seal [SealSize]byte
	if s != nil {
		res.Seals = make([]byte, 0, (size+PageSize-1)/PageSize*SealSize)
	}
	res.Hashes = make([]byte, 0, (size+PageSize-1)/PageSize*HashSize)
	r := newReflinker(x, out)
	defer r.close()
	// Pages repeated within the image itself (zero-filled pages, often)
	// are shared with their first copy, through dst's own descriptor.
	self := r.addSelf(dst)

	whole := sha256.New()
	buf := make([]byte, blockPages*PageSize)
	var yielded int64
	for first := int64(0); ; first += blockPages {
		n, err := io.ReadFull(in, buf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			return Result{}, err
		}
		b := buf[:n]
		if s != nil {
			for i := 0; i < n; i += PageSize {
				if err := s.Seal(first+int64(i/PageSize), b[i:min(n, i+PageSize)], &seal); err != nil {
					return Result{}, err
				}
				res.Seals = append(res.Seals, seal[:]...)
			}
		}
		// The image's SHA-256 on one goroutine, the pages' on the others.
		hashed := make(chan struct{})
		go func() { whole.Write(b); close(hashed) }()
		sums := Sums(b, PageSize)
		err = storeBlock(b, first, sums, x, r, out, self, &res, func(page int64) error {
			if yield != nil && page%yieldEvery == yieldEvery-1 {
				if err := yield(res.Written - yielded); err != nil {
					return err
				}
				yielded = res.Written
			}
			return nil
		})
		<-hashed
		if err != nil {
			return Result{}, err
		}
		if n < len(buf) {
			break
		}
	}
	if err := r.flush(); err != nil {
		return Result{}, err
	}
	if err := out.Truncate(size); err != nil {
		return Result{}, err
	}
	if yield != nil {
		if err := yield(res.Written - yielded); err != nil {
			return Result{}, err
		}
	}
	res.Reflinks = r.reflinks
	copy(res.Sum[:], whole.Sum(nil))
	res.Size = size
	ok = true
	return res, out.Close()
}

// reflinker shares pages into out from the index's files: a run of
// consecutive pages shared from consecutive pages of one file becomes
// one FICLONERANGE.
type reflinker struct {
	x   *Index
	out *os.File
	// files are the index's files opened so far, by index in x.files.
	files map[int32]*os.File
	self  int32 // out's index, or -1
	run   struct {
		on      bool
		file    int32
		srcPage int64
		dstPage int64
		pages   int64
	}
	reflinks int // FICLONERANGE calls
}

func newReflinker(x *Index, out *os.File) *reflinker {
	return &reflinker{x: x, out: out, files: map[int32]*os.File{}, self: -1}
}

// addSelf adds dst (out's name) to the index's files, so its own pages
// can be shared with later ones, and returns its index.
func (r *reflinker) addSelf(dst string) int32 {
	r.self = int32(len(r.x.files))
	r.x.files = append(r.x.files, dst)
	r.files[r.self] = r.out
	return r.self
}

// share puts the indexed page l at page of out: it extends the current
// run, or flushes it and starts another.
func (r *reflinker) share(l loc, page int64) error {
	if r.run.on && r.run.file == l.file && r.run.srcPage+r.run.pages == l.page && r.run.dstPage+r.run.pages == page {
		r.run.pages++
		return nil
	}
	if err := r.flush(); err != nil {
		return err
	}
	r.run.on, r.run.file, r.run.srcPage, r.run.dstPage, r.run.pages = true, l.file, l.page, page, 1
	return nil
}

// flush clones the current run, if any, into out.
func (r *reflinker) flush() error {
	if !r.run.on {
		return nil
	}
	r.run.on = false
	f, ok := r.files[r.run.file]
	if !ok {
		var err error
		if f, err = os.Open(r.x.files[r.run.file]); err != nil {
			return err
		}
		r.files[r.run.file] = f
	}
	err := unix.IoctlFileCloneRange(int(r.out.Fd()), &unix.FileCloneRange{
		Src_fd: int64(f.Fd()), Src_offset: uint64(r.run.srcPage * PageSize),
		Src_length: uint64(r.run.pages * PageSize), Dest_offset: uint64(r.run.dstPage * PageSize),
	})
	if err != nil {
		return fmt.Errorf("reflink %d pages from %s: %w", r.run.pages, r.x.files[r.run.file], err)
	}
	r.reflinks++
	return nil
}

// close closes the files the reflinker opened (not out, whose owner
// closes it).
func (r *reflinker) close() {
	for i, f := range r.files {
		if i != r.self {
			f.Close()
		}
	}
}

// blockPages is how many pages a store reads at once.
const blockPages = 1024

// Sums returns the SHA-256s of b's chunks of size bytes (the last may
// be shorter), hashed on as many goroutines as there are CPUs.
func Sums(b []byte, size int) [][HashSize]byte {
	sums := make([][HashSize]byte, (len(b)+size-1)/size)
	workers := min(runtime.GOMAXPROCS(0), len(sums))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(sums); i += workers {
				sums[i] = sha256.Sum256(b[i*size : min(len(b), (i+1)*size)])
			}
		})
	}
	wg.Wait()
	return sums
}

// storeBlock stores the pages b, from page first on, whose SHA-256s are
// sums: each known page shared, runs of new ones written at once (before
// anything shares them). yield is called before each page.
func storeBlock(b []byte, first int64, sums [][HashSize]byte, x *Index, r *reflinker, out *os.File, self int32, res *Result, yield func(page int64) error) error {
	run := -1 // the first new page not written yet
	write := func(end int) error {
		if run < 0 {
			return nil
		}
		if err := r.flush(); err != nil {
			return err
		}
		if _, err := out.WriteAt(b[run*PageSize:min(len(b), end*PageSize)], (first+int64(run))*PageSize); err != nil {
			return err
		}
		run = -1
		return nil
	}
	for i, h := range sums {
		page := first + int64(i)
		if err := yield(page); err != nil {
			return err
		}
		n := min(PageSize, len(b)-i*PageSize)
		res.Hashes = append(res.Hashes, h[:]...)
		res.Pages++
		l, known := x.pages[h]
		if n == PageSize && known {
			if err := write(i); err != nil {
				return err
			}
			if err := r.share(l, page); err != nil {
				return err
			}
			res.Shared++
			continue
		}
		if run < 0 {
			run = i
		}
		res.Written += int64(n)
		if n == PageSize && !known {
			x.pages[h] = loc{file: self, page: page}
		}
	}
	return write(len(sums))
}

// storeSmall stores a file shorter than a page: shared whole with an
// indexed file of the same content, or written.
func storeSmall(in, out *os.File, dst string, size int64, x *Index, s Sealer, ok *bool) (Result, error) {
	b, err := io.ReadAll(in)
	if err != nil {
		return Result{}, err
	}
	if int64(len(b)) != size {
		return Result{}, fmt.Errorf("%s changed size while stored", dst)
	}
	var seals []byte
	if s != nil && size > 0 {
		var seal [SealSize]byte
		if err := s.Seal(0, b, &seal); err != nil {
			return Result{}, err
		}
		seals = seal[:]
	}
	res := Result{Size: size, Pages: 1, Sum: sha256.Sum256(b), Seals: seals}
	res.Hashes = res.Sum[:]
	shared := false
	if src, found := x.small[res.Sum]; found && size > 0 {
		if f, err := os.Open(src); err == nil {
			shared = unix.IoctlFileClone(int(out.Fd()), int(f.Fd())) == nil
			f.Close()
		}
	}
	if shared {
		res.Shared = 1
	} else {
		if _, err := out.WriteAt(b, 0); err != nil {
			return Result{}, err
		}
		res.Written = size
	}
	x.AddSmall(dst, res.Sum)
	*ok = true
	return res, out.Close()
}
