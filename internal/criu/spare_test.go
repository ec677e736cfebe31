package criu

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/ns"
)

func nsInode(t *testing.T, pid int, name string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, name), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// A restore on a spare CRIU puts the tree into the spare's own network,
// UTS and IPC namespaces (named as the caller set), uses the spare up,
// and a spare can serve only once.
func TestRestoreOnSpare(t *testing.T) {
	tool := realTool(t)
	ctx := testCtx(t)
	c := startCounter(t, 1<<20)
	before := waitCount(t, c.port, 3)
	images, dumpWork, restoreWork := dirs3(t)
	if _, err := tool.Dump(ctx, DumpOptions{Pid: c.pid(), ImagesDir: images, WorkDir: dumpWork}); err != nil {
		t.Fatal(err)
	}
	c.kill()

	sp, err := tool.StartSpare()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.Kill)
	spareAll := map[string]uint64{}
	for _, name := range []string{"net", "uts", "ipc"} {
		spareAll[name] = nsInode(t, sp.Pid(), name)
		if spareAll[name] == nsInode(t, os.Getpid(), name) {
			t.Fatalf("the spare runs in the caller's %s namespace", name)
		}
	}
	if err := sp.SetHostname("spare-host"); err != nil {
		t.Fatal(err)
	}
	rs, err := tool.Restore(ctx, RestoreOptions{ImagesDir: images, WorkDir: restoreWork, RstSibling: true, Spare: sp})
	if err != nil {
		t.Fatal(err)
	}
	adopt(t, rs.Pid)
	for name, want := range spareAll {
		if got := nsInode(t, rs.Pid, name); got != want {
			t.Fatalf("restored tree in %s namespace %d, want the spare's %d", name, got, want)
		}
	}
	var uts unix.Utsname
	if err := ns.DoPid(rs.Pid, unix.CLONE_NEWUTS, func() error { return unix.Uname(&uts) }); err != nil {
		t.Fatal(err)
	}
	if h := unix.ByteSliceToString(uts.Nodename[:]); h != "spare-host" {
		t.Fatalf("restored tree's hostname %q, want spare-host", h)
	}
	if sp.Pid() != 0 {
		t.Fatal("the spare is still listed after serving a restore")
	}
	// The restored counter listens in that namespace, counting on.
	var n int
	err = ns.DoPid(rs.Pid, unix.CLONE_NEWNET, func() (err error) {
		n, err = count(c.port)
		return err
	})
	if err != nil || n < before {
		t.Fatalf("restored counter: %d, %v; want at least %d", n, err, before)
	}

	// Used up: a second restore on it fails before starting anything.
	_, err = tool.Restore(ctx, RestoreOptions{ImagesDir: images, WorkDir: t.TempDir(), RstSibling: true, Spare: sp})
	if !errors.Is(err, errSpareGone) {
		t.Fatalf("restore on a used spare: %v, want %v", err, errSpareGone)
	}

	// A spare with a network namespace of the caller's choice is refused,
	// and the refusal kills it.
	sp2, err := tool.StartSpare()
	if err != nil {
		t.Fatal(err)
	}
	pid2 := sp2.Pid()
	self, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	_, err = tool.Restore(ctx, RestoreOptions{ImagesDir: images, WorkDir: t.TempDir(), RstSibling: true, Spare: sp2, Namespaces: []ns.Ref{{Type: unix.CLONE_NEWNET, File: self}}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("restore on a spare with Namespaces: %v, want invalid argument", err)
	}
	if sp2.Pid() != 0 || unix.Kill(pid2, 0) == nil {
		t.Fatalf("refused spare %d still runs", pid2)
	}
}

// A dump runs on a spare started in the tree's namespaces, once; the
// images restore; a spare with Namespaces as well is refused and killed.
func TestDumpOnSpare(t *testing.T) {
	tool := realTool(t)
	ctx := testCtx(t)
	c := startCounter(t, 1<<20)
	waitCount(t, c.port, 2)
	self, err := os.Open("/proc/self/ns/uts")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	nss := []ns.Ref{{Type: unix.CLONE_NEWUTS, File: self}}
	sp, err := tool.StartSpareIn(nss)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.Kill)
	images, dumpWork, restoreWork := dirs3(t)
	if _, err := tool.Dump(ctx, DumpOptions{Pid: c.pid(), ImagesDir: images, WorkDir: dumpWork, Spare: sp}); err != nil {
		t.Fatal(err)
	}
	c.kill()
	if sp.Pid() != 0 {
		t.Fatal("the spare is still listed after serving a dump")
	}
	if _, err := tool.Dump(ctx, DumpOptions{Pid: os.Getpid(), ImagesDir: t.TempDir(), Spare: sp}); !errors.Is(err, errSpareGone) {
		t.Fatalf("dump on a used spare: %v, want %v", err, errSpareGone)
	}
	rs, err := tool.Restore(ctx, RestoreOptions{ImagesDir: images, WorkDir: restoreWork, RstSibling: true})
	if err != nil {
		t.Fatal(err)
	}
	adopt(t, rs.Pid)

	sp2, err := tool.StartSpareIn(nss)
	if err != nil {
		t.Fatal(err)
	}
	pid2 := sp2.Pid()
	_, err = tool.Dump(ctx, DumpOptions{Pid: rs.Pid, ImagesDir: t.TempDir(), Spare: sp2, Namespaces: nss})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("dump on a spare with Namespaces: %v, want invalid argument", err)
	}
	if sp2.Pid() != 0 || unix.Kill(pid2, 0) == nil {
		t.Fatalf("refused spare %d still runs", pid2)
	}
}
