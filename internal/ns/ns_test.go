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
