// Validation of a checkpoint's CRIU images that may come from someone
// else: see ValidateImages.

package criu

import (
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/molt-sh/molt/internal/errdefs"
)

// Limits bound what ValidateImages accepts of one dump. Every size,
// count and length read from the images is checked against them before
// it is used, so validation allocates at most in proportion to them.
type Limits struct {
	// Files bounds the files of the images directory.
	Files int
	// ImageBytes bounds one image other than a pages image (read whole).
	ImageBytes int64
	// EntryBytes bounds one entry's message.
	EntryBytes int
	// Entries bounds the entries of one image.
	Entries int
	// Tasks bounds the threads of the tree (what a restore creates).
	Tasks int
	// PagesBytes bounds the pages images together (the tree's memory).
	PagesBytes int64
	// Mounts bounds the mounts of one mount namespace.
	Mounts int
	// Path bounds a path recorded in the images (PATH_MAX).
	Path int
}

// DefaultLimits are generous for an agent's sandbox: far above what a
// sandbox's images hold (tens of files, kilobytes per image, a few
// tasks), far below what would exhaust the daemon.
func DefaultLimits() Limits {
	return Limits{
		Files: 1 << 16, ImageBytes: 64 << 20, EntryBytes: 16 << 20, Entries: 1 << 20,
		Tasks: 1 << 15, PagesBytes: 256 << 30, Mounts: 256, Path: 4096,
	}
}

// ValidateImages checks the whole image set of one dump in dir, as it
// might have been written by someone else, before CRIU reads it: CRIU
// runs as root on the host and trusts its images. It checks that
//
//   - every file is an image of a kind molt's dumps hold, known by its
//     name and its magic, or a raw image another image refers to (a
//     pages image named by a pagemap, a tmpfs archive by its mount, a
//     network dump by its namespace);
//   - each image decodes completely (no trailing bytes, no short entry),
//     within lim's bounds of size, entries and entry size;
//   - the inventory is there, once, of CRIU's image version;
//   - the process tree has unique PIDs and thread IDs, one root, parents
//     that exist and no loop, at most lim.Tasks threads, and each task
//     the core, mm, pagemap, ids and fs images a restore needs, and no
//     per-task image of a task that is not in it;
//   - pagemap entries are page-aligned, ascending, non-overlapping, none
//     in a parent image, and the pages they say are present fill their
//     pages image exactly;
//   - recorded paths (open files, remaps, sockets' directories, mounts)
//     are absolute, bounded, without NUL or "..", and refer to files and
//     mounts that exist in the images;
//   - the mount table holds only the mounts molt makes in a sandbox (its
//     root, /proc, /sys, /dev/pts, the masks and read-only binds) and no
//     bind of a host path;
//   - fs, ids and fdinfo images refer to files and images that exist.
//
// A failure wraps errdefs.ErrFailedPrecondition and names the file, the
// entry and what is wrong.
func ValidateImages(dir string, lim Limits) error {
	set, err := loadImages(dir, lim)
	if err != nil {
		return err
	}
	for _, check := range []func() error{
		set.checkInventory, set.checkTree, set.checkPages, set.checkFiles, set.checkMounts, set.checkRaw,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// refuse is a validation failure about file.
func refuse(file, format string, args ...any) error {
	return fmt.Errorf("checkpoint images: %s: %s: %w", file, fmt.Sprintf(format, args...), errdefs.ErrFailedPrecondition)
}

// imageKind is a kind of image molt's dumps hold: its CRIU kind (magic
// name), its file name (a pattern whose group, if any, is a number), the
// message of its entries and the raw bytes after each.
type imageKind struct {
	kind  string
	name  *regexp.Regexp
	msg   func(i int) proto.Message
	extra func(proto.Message) int
	// one: the image holds exactly one entry.
	one bool
	// hex: the name's number is hexadecimal.
	hex bool
}

// rawKinds are images without magic or entries, by name: what refers to
// them is checked (checkRaw, checkPages), not their content.
var rawKinds = map[string]*regexp.Regexp{
	"pages":     regexp.MustCompile(`^pages-(\d+)\.img$`),
	"tmpfs-dev": regexp.MustCompile(`^tmpfs-dev-(\d+)\.tar\.gz\.img$`),
	"net":       regexp.MustCompile(`^(?:ifaddr|route|route6|rule|iptables|ip6tables|nftables)-(\d+)\.img$`),
}

// image is one decoded image of the set.
type image struct {
	name    string
	kind    *imageKind
	num     uint64 // the number in its name
	entries []imageEntry
	rest    []byte // a ghost file's content
}

// imageSet is a dump's images, decoded.
type imageSet struct {
	lim    Limits
	dir    string
	byName map[string]*image
	byKind map[string][]*image
	// raw images: name -> size
	raw map[string]int64
}

func (s *imageSet) one(name string) *image { return s.byName[name] }

// loadImages lists dir and decodes each image in it.
func loadImages(dir string, lim Limits) (*imageSet, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint images: %w", err)
	}
	defer d.Close()
	ents, err := d.ReadDir(lim.Files + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("checkpoint images %s: %w", dir, err)
	}
	if len(ents) > lim.Files {
		return nil, refuse(dir, "more than %d files", lim.Files)
	}
	s := &imageSet{lim: lim, dir: dir, byName: map[string]*image{}, byKind: map[string][]*image{}, raw: map[string]int64{}}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	for _, e := range ents {
		if err := s.load(int(d.Fd()), e.Name()); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// load reads and decodes the file name of the directory dirfd.
func (s *imageSet) load(dirfd int, name string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return refuse(name, "cannot open: %v", err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return refuse(name, "%v", err)
	}
	if !fi.Mode().IsRegular() {
		return refuse(name, "not a regular file (%v)", fi.Mode().Type())
	}
	for k, re := range rawKinds {
		if re.MatchString(name) {
			if k != "pages" && fi.Size() > s.lim.ImageBytes {
				return refuse(name, "%d bytes, over the limit of %d", fi.Size(), s.lim.ImageBytes)
			}
			s.raw[name] = fi.Size()
			return nil
		}
	}
	kind, num, err := kindOf(name)
	if err != nil {
		return err
	}
	if fi.Size() > s.lim.ImageBytes {
		return refuse(name, "%d bytes, over the limit of %d", fi.Size(), s.lim.ImageBytes)
	}
	b := make([]byte, fi.Size())
	if _, err := io.ReadFull(f, b); err != nil {
		return refuse(name, "read: %v", err)
	}
	if kind == nil {
		return refuse(name, "%s", unknownImage(b))
	}
	im, err := decodeKind(name, b, kind, s.lim)
	if err != nil {
		return err
	}
	im.num = num
	s.byName[name] = im
	s.byKind[kind.kind] = append(s.byKind[kind.kind], im)
	return nil
}

// kindOf is the kind of image a file name says (nil: none molt knows)
// and the number in the name.
func kindOf(name string) (*imageKind, uint64, error) {
	for i := range validKinds {
		k := &validKinds[i]
		m := k.name.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		if len(m) < 2 {
			return k, 0, nil
		}
		base := 10
		if k.hex {
			base = 16
		}
		n, err := strconv.ParseUint(m[1], base, 32)
		if err != nil {
			return nil, 0, refuse(name, "number out of range")
		}
		return k, n, nil
	}
	return nil, 0, nil
}

// unknownImage says what a file of no known name holds.
func unknownImage(b []byte) string {
	var m uint32
	for i := 0; i < 2 && len(b) >= 4*(i+1); i++ {
		m = uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24
		if m != imgCommonMagic && m != imgServiceMagic {
			break
		}
	}
	if k, ok := magics.ByValue[uint64(m)]; ok {
		return fmt.Sprintf("an image of kind %s, which molt's checkpoints never hold", k)
	}
	return "not an image of molt's checkpoints (unknown name and magic)"
}

// decodeKind decodes b as an image of kind k, whole.
func decodeKind(name string, b []byte, k *imageKind, lim Limits) (*image, error) {
	magic, err := magicOf(k.kind)
	if err != nil {
		return nil, err
	}
	max := 0
	if k.kind == "GHOST_FILE" {
		max = 1 // its head; the file's content follows (checkGhost)
	}
	next, extra, done := k.msg, k.extra, func() bool { return true }
	if k.kind == "IPCNS_MSG" {
		next, extra, done = msgQueues()
	}
	ents, rest, err := decodeImage(name, b, magic, max, entryBounds{size: lim.EntryBytes, count: lim.Entries}, next, extra)
	if err != nil {
		return nil, fmt.Errorf("checkpoint images: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	if !done() {
		return nil, refuse(name, "a message queue's messages are cut short")
	}
	if k.one && len(ents) != 1 {
		return nil, refuse(name, "%d entries, want 1", len(ents))
	}
	im := &image{name: name, kind: k, entries: ents, rest: rest}
	if k.kind == "GHOST_FILE" {
		if len(ents) != 1 {
			return nil, refuse(name, "no ghost file entry")
		}
		if err := checkGhost(im, lim); err != nil {
			return nil, err
		}
	}
	return im, nil
}

// validName checks a path recorded in the images: absolute, at most
// lim.Path bytes, no NUL and no ".." element (the kernel records
// resolved paths; ".." could only lead out of the sandbox's root).
func validName(file, what, p string, lim Limits) error {
	switch {
	case len(p) > lim.Path:
		return refuse(file, "%s: a %d-byte path, over the limit of %d", what, len(p), lim.Path)
	case strings.IndexByte(p, 0) >= 0:
		return refuse(file, "%s: path %q holds a NUL byte", what, p)
	case !strings.HasPrefix(p, "/"):
		return refuse(file, "%s: path %q is not absolute", what, p)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return refuse(file, "%s: path %q leads out with \"..\"", what, p)
		}
	}
	return nil
}

// names lists the set's image names of kind k, sorted.
func (s *imageSet) names(k string) []*image {
	l := s.byKind[k]
	sort.Slice(l, func(i, j int) bool { return l[i].name < l[j].name })
	return l
}
