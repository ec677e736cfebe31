package criu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mnt"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"google.golang.org/protobuf/proto"

	"github.com/molt-sh/molt/internal/errdefs"
)

// sandboxDump is a real dump of a sandbox (pid1, a shell, a pipeline of
// `cat /dev/zero | sleep` and a `sleep`: its mount table, pipes and
// files), taken by a full checkpoint of internal/core; its pages
// images are cut to at most two pages per task, with the pagemaps cut to
// match, and the queued pipe data dropped (testdata/README.md).
const sandboxDump = "testdata/sandbox-dump"

// copyDump copies the images of dir to a new directory.
func copyDump(t testing.TB, dir string) string {
	t.Helper()
	dst := t.TempDir()
	if out, err := exec.Command("cp", "-a", dir+"/.", dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	return dst
}

// editImage rewrites image name of dir with what edit makes of its
// entries.
func editImage(t testing.TB, dir, name string, edit func([]imageEntry) []imageEntry) {
	t.Helper()
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	k, _, err := kindOf(name)
	if err != nil || k == nil {
		t.Fatalf("%s: no kind (%v)", name, err)
	}
	im, err := decodeKind(name, b, k, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	ents := edit(im.entries)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := writeEntries(p, k.kind, ents); err != nil {
		t.Fatal(err)
	}
}

// firstOf returns the name of the first image of dir matching glob.
func firstOf(t testing.TB, dir, glob string) string {
	t.Helper()
	l, _ := filepath.Glob(filepath.Join(dir, glob))
	if len(l) == 0 {
		t.Fatalf("no %s in %s", glob, dir)
	}
	sort.Strings(l)
	return filepath.Base(l[0])
}

// pagesOf returns a task's pagemap with present pages and its pages
// image.
func pagesOf(t testing.TB, dir string) (pm, pages string) {
	t.Helper()
	l, _ := filepath.Glob(filepath.Join(dir, "pagemap-*.img"))
	sort.Strings(l)
	for _, p := range l {
		head, _, err := readPagemap(p)
		if err != nil {
			t.Fatal(err)
		}
		pg := fmt.Sprintf("pages-%d.img", head.GetPagesId())
		if fi, err := os.Stat(filepath.Join(dir, pg)); err == nil && fi.Size() >= 2*pageSize {
			return filepath.Base(p), pg
		}
	}
	t.Fatalf("no pages image of two pages in %s", dir)
	return "", ""
}

func cutFile(t testing.TB, p string, n int64) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, fi.Size()-n); err != nil {
		t.Fatal(err)
	}
}

// tamperings are the ways TestValidateImagesRefusesTampered spoils a
// dump, each with what the refusal must name. mounts: the dump has a
// mount table.
type tampering struct {
	name   string
	mounts bool
	do     func(t *testing.T, dir string) (file, what string)
}

var tamperings = []tampering{
	{name: "pagemap claims more pages", do: func(t *testing.T, dir string) (string, string) {
		pm, pages := pagesOf(t, dir)
		editImage(t, dir, pm, func(e []imageEntry) []imageEntry {
			last := e[len(e)-1].msg.(*pagemap.PagemapEntry)
			va := last.GetVaddr() + nrPages(last)*pageSize + 1<<20
			return append(e, imageEntry{msg: &pagemap.PagemapEntry{Vaddr: proto.Uint64(va), NrPages: proto.Uint32(1), Flags: proto.Uint32(pagePresent)}})
		})
		return pages, "present pages"
	}},
	{name: "truncated page file", do: func(t *testing.T, dir string) (string, string) {
		_, pages := pagesOf(t, dir)
		cutFile(t, filepath.Join(dir, pages), pageSize)
		return pages, "present pages"
	}},
	{name: "page file cut mid-page", do: func(t *testing.T, dir string) (string, string) {
		_, pages := pagesOf(t, dir)
		cutFile(t, filepath.Join(dir, pages), 1)
		return pages, "present pages"
	}},
	{name: "overlapping pagemap entries", do: func(t *testing.T, dir string) (string, string) {
		pm, _ := pagesOf(t, dir)
		editImage(t, dir, pm, func(e []imageEntry) []imageEntry {
			first := e[1].msg.(*pagemap.PagemapEntry)
			return append(e[:2], append([]imageEntry{{msg: &pagemap.PagemapEntry{Vaddr: proto.Uint64(first.GetVaddr()), NrPages: proto.Uint32(1), Flags: proto.Uint32(0)}}}, e[2:]...)...)
		})
		return pm, "overlaps"
	}},
	{name: "unaligned pagemap entry", do: func(t *testing.T, dir string) (string, string) {
		pm, _ := pagesOf(t, dir)
		editImage(t, dir, pm, func(e []imageEntry) []imageEntry {
			e[1].msg.(*pagemap.PagemapEntry).Vaddr = proto.Uint64(e[1].msg.(*pagemap.PagemapEntry).GetVaddr() + 8)
			return e
		})
		return pm, "not page-aligned"
	}},
	{name: "orphan pages image", do: func(t *testing.T, dir string) (string, string) {
		if err := os.WriteFile(filepath.Join(dir, "pages-999.img"), make([]byte, pageSize), 0o600); err != nil {
			t.Fatal(err)
		}
		return "pages-999.img", "no pagemap names it"
	}},
	{name: "reg-file path ../../etc/shadow", do: func(t *testing.T, dir string) (string, string) {
		setRegName(t, dir, "../../etc/shadow")
		return "files.img", `"../../etc/shadow" is not absolute`
	}},
	{name: "reg-file path /../../etc/shadow", do: func(t *testing.T, dir string) (string, string) {
		setRegName(t, dir, "/../../etc/shadow")
		return "files.img", `leads out with ".."`
	}},
	{name: "reg-file path with NUL", do: func(t *testing.T, dir string) (string, string) {
		setRegName(t, dir, "/etc/passwd\x00x")
		return "files.img", "NUL"
	}},
	{name: "reg-file path too long", do: func(t *testing.T, dir string) (string, string) {
		setRegName(t, dir, "/"+strings.Repeat("a", 5000))
		return "files.img", "over the limit"
	}},
	{name: "bind mount of a host path", mounts: true, do: func(t *testing.T, dir string) (string, string) {
		mp := firstOf(t, dir, "mountpoints-*.img")
		editImage(t, dir, mp, func(e []imageEntry) []imageEntry {
			for _, x := range e {
				if m := x.msg.(*mnt.MntEntry); strings.HasSuffix(m.GetRoot(), "/dev/null") {
					m.Root = proto.String("/etc")
					break
				}
			}
			return e
		})
		return mp, `a bind mount of "/etc"`
	}},
	{name: "bind mount of a host filesystem", mounts: true, do: func(t *testing.T, dir string) (string, string) {
		mp := firstOf(t, dir, "mountpoints-*.img")
		editImage(t, dir, mp, func(e []imageEntry) []imageEntry {
			top := e[len(e)-1].msg.(*mnt.MntEntry)
			for _, x := range e {
				if m := x.msg.(*mnt.MntEntry); cleanMP(m.GetMountpoint()) == "/" {
					top = m
				}
			}
			return append(e, imageEntry{msg: &mnt.MntEntry{Fstype: proto.Uint32(0), MntId: proto.Uint32(4000), RootDev: proto.Uint32(top.GetRootDev() + 1),
				ParentMntId: proto.Uint32(top.GetMntId()), Flags: proto.Uint32(0), Root: proto.String("/"), Mountpoint: proto.String("/mnt/host"),
				Source: proto.String("/dev/sda1"), Options: proto.String("")}})
		})
		return mp, "a bind mount of a host filesystem"
	}},
	{name: "host devpts", mounts: true, do: func(t *testing.T, dir string) (string, string) {
		mp := firstOf(t, dir, "mountpoints-*.img")
		editImage(t, dir, mp, func(e []imageEntry) []imageEntry {
			for _, x := range e {
				if m := x.msg.(*mnt.MntEntry); m.GetFstype() == uint32(mnt.Fstype_DEVPTS) {
					m.Options = proto.String("gid=5,mode=620")
				}
			}
			return e
		})
		return mp, "devpts other than a new instance"
	}},
	{name: "mount namespace of no image", mounts: true, do: func(t *testing.T, dir string) (string, string) {
		mp := firstOf(t, dir, "mountpoints-*.img")
		if err := os.Rename(filepath.Join(dir, mp), filepath.Join(dir, "mountpoints-4000.img")); err != nil {
			t.Fatal(err)
		}
		return "ids-", "neither the dump's root namespace"
	}},
	{name: "pstree loop", do: func(t *testing.T, dir string) (string, string) {
		editImage(t, dir, "pstree.img", func(e []imageEntry) []imageEntry {
			// Two tasks, each the other's parent.
			r := e[0].msg.(*pstree.PstreeEntry).GetPid()
			return append(e,
				imageEntry{msg: &pstree.PstreeEntry{Pid: proto.Uint32(r + 1000), Ppid: proto.Uint32(r + 1001), Pgid: proto.Uint32(r), Sid: proto.Uint32(r)}},
				imageEntry{msg: &pstree.PstreeEntry{Pid: proto.Uint32(r + 1001), Ppid: proto.Uint32(r + 1000), Pgid: proto.Uint32(r), Sid: proto.Uint32(r)}})
		})
		return "pstree.img", "loop"
	}},
	{name: "pstree duplicate pid", do: func(t *testing.T, dir string) (string, string) {
		editImage(t, dir, "pstree.img", func(e []imageEntry) []imageEntry {
			d := proto.Clone(e[len(e)-1].msg).(*pstree.PstreeEntry)
			d.Threads = nil
			return append(e, imageEntry{msg: d})
		})
		return "pstree.img", "appears twice"
	}},
	{name: "pstree second root", do: func(t *testing.T, dir string) (string, string) {
		editImage(t, dir, "pstree.img", func(e []imageEntry) []imageEntry {
			r := e[0].msg.(*pstree.PstreeEntry).GetPid()
			return append(e, imageEntry{msg: &pstree.PstreeEntry{Pid: proto.Uint32(r + 1000), Ppid: proto.Uint32(0), Pgid: proto.Uint32(r), Sid: proto.Uint32(r)}})
		})
		return "pstree.img", "second root"
	}},
	{name: "task without core image", do: func(t *testing.T, dir string) (string, string) {
		core := firstOf(t, dir, "core-*.img")
		if err := os.Remove(filepath.Join(dir, core)); err != nil {
			t.Fatal(err)
		}
		return core, "missing"
	}},
	{name: "image of no task", do: func(t *testing.T, dir string) (string, string) {
		core := firstOf(t, dir, "core-*.img")
		b, _ := os.ReadFile(filepath.Join(dir, core))
		if err := os.WriteFile(filepath.Join(dir, "core-4000.img"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return "core-4000.img", "no task 4000"
	}},
	{name: "oversized entry length", do: func(t *testing.T, dir string) (string, string) {
		core := firstOf(t, dir, "core-*.img")
		p := filepath.Join(dir, core)
		b, _ := os.ReadFile(p)
		binary.LittleEndian.PutUint32(b[8:], 1<<30) // the first entry's size
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return core, "over the limit"
	}},
	{name: "entry beyond the file", do: func(t *testing.T, dir string) (string, string) {
		p := filepath.Join(dir, "pstree.img")
		b, _ := os.ReadFile(p)
		binary.LittleEndian.PutUint32(b[8:], uint32(len(b)))
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return "pstree.img", "short file"
	}},
	{name: "trailing garbage", do: func(t *testing.T, dir string) (string, string) {
		core := firstOf(t, dir, "core-*.img")
		f, _ := os.OpenFile(filepath.Join(dir, core), os.O_APPEND|os.O_WRONLY, 0)
		f.Write([]byte{1, 2})
		f.Close()
		return core, "short file"
	}},
	{name: "unknown image file", do: func(t *testing.T, dir string) (string, string) {
		if err := os.WriteFile(filepath.Join(dir, "evil.img"), []byte("#!/bin/sh\nid\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return "evil.img", "unknown name and magic"
	}},
	{name: "image of a kind molt never dumps", do: func(t *testing.T, dir string) (string, string) {
		m, _ := magicOf("BINFMT_MISC")
		b := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, imgCommonMagic), m)
		if err := os.WriteFile(filepath.Join(dir, "binfmt-misc.img"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return "binfmt-misc.img", "kind BINFMT_MISC"
	}},
	{name: "symlink in the images", do: func(t *testing.T, dir string) (string, string) {
		if err := os.Symlink("/etc/shadow", filepath.Join(dir, "pages-77.img")); err != nil {
			t.Fatal(err)
		}
		return "pages-77.img", "cannot open"
	}},
	{name: "no inventory", do: func(t *testing.T, dir string) (string, string) {
		os.Remove(filepath.Join(dir, "inventory.img"))
		return "inventory.img", "missing"
	}},
	{name: "fdinfo naming no file", do: func(t *testing.T, dir string) (string, string) {
		fd := firstOf(t, dir, "fdinfo-*.img")
		editImage(t, dir, fd, func(e []imageEntry) []imageEntry {
			e[0].msg.(*fdinfo.FdinfoEntry).Id = proto.Uint32(1 << 30)
			return e
		})
		return fd, "not in files.img"
	}},
	{name: "thread listed twice", do: func(t *testing.T, dir string) (string, string) {
		editImage(t, dir, "pstree.img", func(e []imageEntry) []imageEntry {
			p := e[len(e)-1].msg.(*pstree.PstreeEntry)
			p.Threads = append(p.Threads, e[0].msg.(*pstree.PstreeEntry).GetPid())
			return e
		})
		return "pstree.img", "listed twice"
	}},
}

// setRegName sets the path of the first regular file of files.img.
func setRegName(t *testing.T, dir, name string) {
	editImage(t, dir, "files.img", func(e []imageEntry) []imageEntry {
		for _, x := range e {
			if r := x.msg.(*fdinfo.FileEntry).GetReg(); r != nil {
				r.Name = proto.String(name)
				break
			}
		}
		return e
	})
}

// TestValidateImagesRefusesTampered: real dumps (a sandbox's, from
// testdata, and a fresh one of a process with a socket and a heap, by
// the installed CRIU) pass; each tampering is refused as a failed
// precondition naming the file and what is wrong.
func TestValidateImagesRefusesTampered(t *testing.T) {
	dumps := map[string]string{"sandbox": sandboxDump}
	if os.Getuid() == 0 || os.Getenv("MOLT_REQUIRE_PRIVILEGED") != "" {
		dumps["process"] = freshDump(t)
	}
	for name, base := range dumps {
		t.Run(name, func(t *testing.T) {
			if err := ValidateImages(base, DefaultLimits()); err != nil {
				t.Fatalf("the untouched dump: %v", err)
			}
			_, hasMounts := os.Stat(filepath.Join(base, firstOfOr(base, "mountpoints-*.img")))
			for _, tc := range tamperings {
				if tc.mounts && hasMounts != nil {
					continue
				}
				t.Run(tc.name, func(t *testing.T) {
					dir := copyDump(t, base)
					file, what := tc.do(t, dir)
					err := ValidateImages(dir, DefaultLimits())
					if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), what) {
						t.Fatalf("ValidateImages = %v; want a refusal naming %s and %q", err, file, what)
					}
					t.Log(err)
				})
			}
		})
	}
}

func firstOfOr(dir, glob string) string {
	l, _ := filepath.Glob(filepath.Join(dir, glob))
	if len(l) == 0 {
		return "none"
	}
	return filepath.Base(l[0])
}

// freshDump dumps a counter process (a heap, a listening socket) with
// the installed CRIU.
func freshDump(t *testing.T) string {
	tool := realTool(t)
	c := startCounter(t, 1<<20)
	images, work, _ := dirs3(t)
	if _, err := tool.Dump(testCtx(t), DumpOptions{Pid: c.pid(), ImagesDir: images, WorkDir: work}); err != nil {
		t.Fatal(err)
	}
	return images
}

// TestValidateImagesLimits: a dump over a limit is refused naming it.
func TestValidateImagesLimits(t *testing.T) {
	for _, tc := range []struct {
		what string
		set  func(*Limits)
	}{
		{"more than 1 tasks", func(l *Limits) { l.Tasks = 1 }},
		{"more than 3 files", func(l *Limits) { l.Files = 3 }},
		{"over the limit of 16", func(l *Limits) { l.EntryBytes = 16 }},
		{"more than 2 entries", func(l *Limits) { l.Entries = 2 }},
		{"mounts, over the limit of 2", func(l *Limits) { l.Mounts = 2 }},
		{"exceed 4096 bytes together", func(l *Limits) { l.PagesBytes = 4096 }},
		{"over the limit of 100", func(l *Limits) { l.ImageBytes = 100 }},
	} {
		lim := DefaultLimits()
		tc.set(&lim)
		err := ValidateImages(sandboxDump, lim)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), tc.what) {
			t.Errorf("%s: ValidateImages = %v", tc.what, err)
		}
	}
}

// BenchmarkValidateImages validates a sandbox's dump (testdata): the
// bytes are those of the images decoded (pages images are only
// measured, never read).
func BenchmarkValidateImages(b *testing.B) {
	var n int64
	ents, _ := os.ReadDir(sandboxDump)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && !strings.HasPrefix(e.Name(), "pages-") {
			n += fi.Size()
		}
	}
	b.SetBytes(n)
	for b.Loop() {
		if err := ValidateImages(sandboxDump, DefaultLimits()); err != nil {
			b.Fatal(err)
		}
	}
}
