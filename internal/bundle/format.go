package bundle

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/molt-sh/molt/internal/ckstore"
	"golang.org/x/sys/unix"
)

// Version is the bundle format this package writes and reads. A later
// molt raises it when an older one must not read what it writes.
const Version = 1

// Entry names of a bundle.
const (
	headerName   = "molt-bundle/header.json"
	manifestName = "molt-bundle/manifest.json"
	sealName     = "molt-bundle/seal.json"
	objectsDir   = "objects/"
	fsDir        = "fs/"
)

// Sizes bounded before they are read.
const (
	maxHeader   = 64 << 10
	maxManifest = 4 << 20
	maxSeal     = 64 << 10
)

// Header is a bundle's first entry: what a host must know before it
// reads the rest.
type Header struct {
	Format int `json:"format"`
	// Molt is the version of molt that wrote the bundle.
	Molt string `json:"molt"`
	// Checkpoint and Kind are the bundled checkpoint's ID and kind.
	Checkpoint string `json:"checkpoint"`
	Kind       string `json:"kind"`
	// CRIU is the version of CRIU that wrote the images ("" for an fs
	// checkpoint).
	CRIU string `json:"criu,omitempty"`
	// Host is what a restore of the images depends on.
	Host Host `json:"host"`
	// Image is the image the checkpoint's sandbox was created from. The
	// bundle carries the whole file tree: the importing host needs no
	// image of that name.
	Image Image `json:"image"`
	// Created is when the bundle was written.
	Created time.Time `json:"created"`
}

// Host is the facts of a host that a CRIU restore depends on.
type Host struct {
	// Arch is GOARCH: images restore on the architecture they were
	// dumped on only.
	Arch string `json:"arch"`
	// Kernel is the exporting host's kernel release (informative: CRIU
	// checks the kernel features it needs at restore).
	Kernel string `json:"kernel"`
	// CPUFlags are the CPU's feature flags (/proc/cpuinfo "flags" on
	// x86, "Features" on arm64): a process may use any of them, and one
	// restored where the CPU lacks it faults on its next such
	// instruction.
	CPUFlags []string `json:"cpu_flags,omitempty"`
}

// Image names an image and where it came from.
type Image struct {
	Name   string `json:"name"`
	Source string `json:"source,omitempty"`
	// Digest is a content digest of the image, when the host has one.
	Digest string `json:"digest,omitempty"`
}

// Seal is a bundle's last entry.
type Seal struct {
	Format int `json:"format"`
	// Header and Manifest are the SHA-256 of the header's and the
	// manifest's entries as they are in the bundle.
	Header   string `json:"header_sha256"`
	Manifest string `json:"manifest_sha256"`
	// FS is the digest of the file tree (treeDigest), FSEntries its
	// entries and FSBytes their contents.
	FS        string             `json:"fs_sha256"`
	FSEntries int64              `json:"fs_entries"`
	FSBytes   int64              `json:"fs_bytes"`
	Signature *ckstore.Signature `json:"signature,omitempty"`
}

// signedBytes is what a seal's signature signs.
func (s Seal) signedBytes() []byte {
	return []byte(strings.Join([]string{"molt-bundle-v1", s.Header, s.Manifest, s.FS,
		strconv.FormatInt(s.FSEntries, 10), strconv.FormatInt(s.FSBytes, 10)}, "\x00"))
}

// LocalHost returns this host's facts.
func LocalHost() Host {
	h := Host{Arch: runtime.GOARCH, CPUFlags: cpuFlags()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		h.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	return h
}

// cpuFlags reads the CPU feature flags of the first processor in
// /proc/cpuinfo, sorted.
func cpuFlags() []string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return nil
	}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		if k = strings.TrimSpace(k); k == "flags" || k == "Features" {
			f := strings.Fields(v)
			slices.Sort(f)
			return slices.Compact(f)
		}
	}
	return nil
}

// MissingCPUFlags returns the flags of want this host's CPU (have)
// lacks.
func MissingCPUFlags(want, have []string) []string {
	set := map[string]bool{}
	for _, f := range have {
		set[f] = true
	}
	var out []string
	for _, f := range want {
		if !set[f] {
			out = append(out, f)
		}
	}
	return out
}

// treeHash is the digest of a file tree as a bundle carries it: per
// entry, in order, its header's fields (canonical JSON) and a newline,
// then a regular file's contents.
type treeHash struct {
	h       hash.Hash
	entries int64
	bytes   int64
}

func newTreeHash() *treeHash { return &treeHash{h: sha256.New()} }

// entryFields are the fields of an entry the tree digest covers: what
// the extractor applies.
type entryFields struct {
	Name   string            `json:"n"`
	Type   string            `json:"t"`
	Mode   int64             `json:"m"`
	UID    int               `json:"u"`
	GID    int               `json:"g"`
	Size   int64             `json:"s"`
	Link   string            `json:"l,omitempty"`
	MTime  int64             `json:"mt"`
	Xattrs map[string]string `json:"x,omitempty"`
}

// entry adds one entry's header (name: relative to the tree, as the
// walker names it) and returns the writer its contents go through.
func (t *treeHash) entry(name, link string, typ byte, mode int64, uid, gid int, size int64, mtime time.Time, pax map[string]string) io.Writer {
	f := entryFields{Name: name, Type: string(typ), Mode: mode, UID: uid, GID: gid, Size: size, Link: link}
	if typ != tar.TypeLink { // a link's times are its target's
		f.MTime = mtime.UnixNano()
	}
	for _, k := range slices.Sorted(maps.Keys(pax)) {
		if strings.HasPrefix(k, "SCHILY.xattr.") {
			if f.Xattrs == nil {
				f.Xattrs = map[string]string{}
			}
			f.Xattrs[k] = pax[k]
		}
	}
	b, _ := json.Marshal(f)
	t.h.Write(b)
	t.h.Write([]byte{'\n'})
	t.entries++
	t.bytes += size
	return t.h
}

func (t *treeHash) sum() string { return hex.EncodeToString(t.h.Sum(nil)) }

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// objectName checks that o is an image the bundle may carry: one flat
// name under images/; it returns the name.
func objectName(o ckstore.Object) (string, error) {
	base, ok := strings.CutPrefix(o.Path, ckstore.ImagesDir+"/")
	if !ok || base == "" || strings.ContainsRune(base, '/') || base == "." || base == ".." {
		return "", fmt.Errorf("object %q is not an image (images/NAME)", o.Path)
	}
	return base, nil
}

// versionCode is a CRIU version "X.Y[.Z]" as major*10000 + minor*100 +
// sublevel, or -1 if it is not one.
func versionCode(v string) int {
	parts := strings.Split(v, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return -1
	}
	code := 0
	for i, mul := range []int{10000, 100, 1} {
		if i >= len(parts) {
			break
		}
		n, err := strconv.Atoi(parts[i])
		if err != nil || n < 0 || n > 99 {
			return -1
		}
		code += n * mul
	}
	return code
}

// CheckCRIU says why images written by CRIU version wrote cannot be
// restored by CRIU version have: an unknown version, or a newer CRIU
// (whose images an older one may misread).
func CheckCRIU(wrote, have string) error {
	w, h := versionCode(wrote), versionCode(have)
	switch {
	case h < 0:
		return fmt.Errorf("this host's CRIU version %q is unknown", have)
	case w < 0:
		return fmt.Errorf("CRIU version %q is not a version", wrote)
	case w > h:
		return fmt.Errorf("the images were written by CRIU %s, newer than this host's %s", wrote, have)
	}
	return nil
}
