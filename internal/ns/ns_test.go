package ns

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/testutil"
)

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// A new namespace is not the caller's, has loopback up, and a process
// started inside Do is born in it while the caller's threads stay out.
func TestNewNetAndDo(t *testing.T) {
	testutil.RequireRoot(t)
	host := inode(t, "/proc/self/ns/net")
	f, err := NewNet()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Ino == host {
		t.Fatal("NewNet returned the caller's namespace")
	}
	if got := inode(t, "/proc/thread-self/ns/net"); got != host {
		t.Fatalf("caller's thread left in namespace %d", got)
	}

	// A child started inside Do is born in the namespace (it waits on
	// its stdin, so that it is still alive, not a zombie without
	// namespaces, when its namespace is read).
	child := exec.Command("cat")
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := Do(f, unix.CLONE_NEWNET, child.Start); err != nil {
		t.Fatal(err)
	}
	childNS := inode(t, fmt.Sprintf("/proc/%d/ns/net", child.Process.Pid))
	stdin.Close()
	if err := child.Wait(); err != nil {
		t.Fatal(err)
	}
	if childNS != st.Ino {
		t.Fatalf("child in namespace %d, want %d", childNS, st.Ino)
	}

	// Loopback is up and it is the only interface: /sys/class/net is
	// the mounter's, so read the kernel's view through a child.
	cmd := exec.Command("cat", "/proc/self/net/dev")
	var out strings.Builder
	cmd.Stdout = &out
	if err := Do(f, unix.CLONE_NEWNET, cmd.Run); err != nil {
		t.Fatal(err)
	}
	var ifaces []string
	for _, l := range strings.Split(out.String(), "\n")[2:] {
		if name, _, ok := strings.Cut(strings.TrimSpace(l), ":"); ok {
			ifaces = append(ifaces, name)
		}
	}
	if len(ifaces) != 1 || ifaces[0] != "lo" {
		t.Fatalf("interfaces in the new namespace: %v, want [lo]", ifaces)
	}
	var up bool
	err = Do(f, unix.CLONE_NEWNET, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		ifr, err := unix.NewIfreq("lo")
		if err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
			return err
		}
		up = ifr.Uint16()&unix.IFF_UP != 0
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !up {
		t.Fatal("loopback is down in the new namespace")
	}
}

// Do returns fn's error and leaves the thread where it was.
func TestDoError(t *testing.T) {
	testutil.RequireRoot(t)
	host := inode(t, "/proc/self/ns/net")
	want := fmt.Errorf("boom")
	err := DoPid(os.Getpid(), unix.CLONE_NEWNET, func() error { return want })
	if err != want {
		t.Fatalf("Do: %v, want fn's error", err)
	}
	if err := DoPid(-1, unix.CLONE_NEWNET, func() error { return nil }); err == nil {
		t.Fatal("Do in the namespace of a missing process succeeded")
	}
	if got := inode(t, "/proc/thread-self/ns/net"); got != host {
		t.Fatalf("thread left in namespace %d", got)
	}
}

// readIn reads a file from a thread in the namespaces refs.
func readIn(t *testing.T, refs []Ref, path string) string {
	t.Helper()
	var b []byte
	if err := Enter(refs, func() (err error) {
		b, err = os.ReadFile(path)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// Fresh makes new namespaces of the asked types only: the UTS one named,
// the network one with socket tables of its own (where the kernel can),
// and the caller's thread stays in its own.
func TestFresh(t *testing.T) {
	testutil.RequireRoot(t)
	refs, err := Fresh(unix.CLONE_NEWNET|unix.CLONE_NEWUTS|unix.CLONE_NEWIPC, "fresh-host")
	if err != nil {
		t.Fatal(err)
	}
	defer Close(refs)
	if len(refs) != 3 {
		t.Fatalf("%d namespaces, want 3", len(refs))
	}
	for _, r := range refs {
		var st unix.Stat_t
		if err := unix.Fstat(int(r.File.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		if st.Ino == inode(t, "/proc/self/ns/"+Name(r.Type)) {
			t.Fatalf("%s: the caller's namespace, want a new one", Name(r.Type))
		}
		if got := inode(t, "/proc/thread-self/ns/"+Name(r.Type)); got != inode(t, "/proc/self/ns/"+Name(r.Type)) {
			t.Fatalf("caller's thread left in %s namespace %d", Name(r.Type), got)
		}
	}
	if h := readIn(t, refs, "/proc/sys/kernel/hostname"); h != "fresh-host" {
		t.Fatalf("hostname %q, want fresh-host", h)
	}
	if _, err := os.Stat("/proc/sys/net/ipv4/tcp_child_ehash_entries"); err == nil {
		if n := readIn(t, refs, "/proc/sys/net/ipv4/tcp_ehash_entries"); n != fmt.Sprint(childTCPBuckets) {
			t.Fatalf("TCP hash buckets of the new namespace: %s, want %d of its own", n, childTCPBuckets)
		}
		// The host's settings are untouched.
		if b, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_child_ehash_entries"); strings.TrimSpace(string(b)) != "0" {
			t.Logf("host's tcp_child_ehash_entries is %s (set outside molt)", b)
		}
	} else {
		t.Log("kernel without per-namespace TCP tables: namespaces share the host's")
	}

	// Only the asked types.
	uts, err := Fresh(unix.CLONE_NEWUTS, "")
	if err != nil {
		t.Fatal(err)
	}
	defer Close(uts)
	if len(uts) != 1 || uts[0].Type != unix.CLONE_NEWUTS {
		t.Fatalf("Fresh(uts): %v", uts)
	}
	if _, err := Fresh(unix.CLONE_NEWPID, ""); err == nil {
		t.Fatal("Fresh of a PID namespace succeeded")
	}
}

// A process started from InNetParent with CLONE_NEWNET gets a network
// namespace with tables of its own.
func TestInNetParent(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/proc/sys/net/ipv4/tcp_child_ehash_entries"); err != nil {
		t.Skip("kernel without per-namespace TCP tables (tcp_child_ehash_entries, 6.1)")
	}
	cmd := exec.Command("cat", "/proc/sys/net/ipv4/tcp_ehash_entries")
	cmd.SysProcAttr = &unix.SysProcAttr{Cloneflags: unix.CLONE_NEWNET}
	var out strings.Builder
	cmd.Stdout = &out
	if err := InNetParent(cmd.Run); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != fmt.Sprint(childTCPBuckets) {
		t.Fatalf("child's TCP hash buckets: %s, want %d", got, childTCPBuckets)
	}
	if got := inode(t, "/proc/thread-self/ns/net"); got != inode(t, "/proc/self/ns/net") {
		t.Fatal("caller's thread left in the parent namespace")
	}
}
