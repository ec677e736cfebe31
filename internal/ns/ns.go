// Package ns runs code in Linux namespaces and makes the namespaces a
// sandbox has.
package ns

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

var names = map[int]string{unix.CLONE_NEWNET: "net", unix.CLONE_NEWUTS: "uts", unix.CLONE_NEWIPC: "ipc", unix.CLONE_NEWCGROUP: "cgroup"}

// Name is the /proc/PID/ns entry of a namespace type ("net", "uts",
// "ipc", "cgroup"), or "" for a type this package does not handle.
func Name(nstype int) string { return names[nstype] }

// Ref is an open namespace of one type.
type Ref struct {
	Type int // CLONE_NEWNET, CLONE_NEWUTS, CLONE_NEWIPC or CLONE_NEWCGROUP
	File *os.File
}

// Close closes every file of refs.
func Close(refs []Ref) {
	for _, r := range refs {
		r.File.Close()
	}
}

// Open opens process pid's namespaces of the types in flags.
func Open(pid, flags int) ([]Ref, error) {
	return openIn(fmt.Sprintf("/proc/%d/ns/", pid), flags)
}

// openIn opens the namespaces of the types in flags from dir, a
// /proc/.../ns/ directory.
func openIn(dir string, flags int) ([]Ref, error) {
	var refs []Ref
	for _, t := range types(flags) {
		f, err := os.Open(dir + names[t])
		if err != nil {
			Close(refs)
			return nil, err
		}
		refs = append(refs, Ref{Type: t, File: f})
	}
	return refs, nil
}

// SetHostname names the UTS namespace of process pid.
func SetHostname(pid int, hostname string) error {
	return DoPid(pid, unix.CLONE_NEWUTS, func() error { return unix.Sethostname([]byte(hostname)) })
}

// types lists the namespace types in flags in a fixed order.
func types(flags int) []int {
	var ts []int
	for _, t := range []int{unix.CLONE_NEWNET, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC, unix.CLONE_NEWCGROUP} {
		if flags&t != 0 {
			ts = append(ts, t)
		}
	}
	return ts
}

// Do runs fn on a locked OS thread that has joined target, a namespace of
// type nstype (CLONE_NEWNET, CLONE_NEWUTS or CLONE_NEWIPC), then returns
// the thread to the caller's namespace. Processes fn starts from that
// thread (os/exec) are born in target. If the thread cannot return, it
// stays locked and dies with its goroutine, never reused.
func Do(target *os.File, nstype int, fn func() error) error {
	return Enter([]Ref{{Type: nstype, File: target}}, fn)
}

// Enter is Do for several namespaces at once.
func Enter(refs []Ref, fn func() error) error {
	flags := 0
	for _, r := range refs {
		if names[r.Type] == "" {
			return fmt.Errorf("namespace type %#x: not handled", r.Type)
		}
		flags |= r.Type
	}
	return onThread(flags, func() error {
		for _, r := range refs {
			if err := unix.Setns(int(r.File.Fd()), r.Type); err != nil {
				return fmt.Errorf("setns %s: %w", names[r.Type], err)
			}
		}
		return nil
	}, fn)
}

// DoPid is Do in the namespace of process pid.
func DoPid(pid, nstype int, fn func() error) error {
	refs, err := Open(pid, nstype)
	if err != nil {
		return err
	}
	defer Close(refs)
	return Enter(refs, fn)
}

// Socket hash tables of the network namespaces NewNet and InNetParent
// make. A namespace created from the host's shares the host's TCP and UDP
// tables, sized for the host's memory (262,144 TCP buckets here), and
// every socket dump of the namespace (CRIU collects sockets at each
// checkpoint) walks all of them: 1.5-6 ms per dump, measured. Tables
// this size cost a few KiB per namespace and are walked in microseconds.
const (
	childTCPBuckets = 1024 // net.ipv4.tcp_child_ehash_entries: 0 or a power of 2
	childUDPBuckets = 128  // net.ipv4.udp_child_hash_entries: 0 or 2^7..2^16
)

var parent struct {
	once sync.Once
	f    *os.File // nil: namespaces are created from the caller's
	err  error
}

// netParent returns the namespace new network namespaces are created
// from: a private, empty one whose child hash-table sysctls are set, so
// the host's settings stay untouched. nil where the kernel lacks the
// sysctls (before 6.1 and 6.2): namespaces then share the host's tables.
func netParent() (*os.File, error) {
	parent.once.Do(func() {
		var f *os.File
		err := onThread(unix.CLONE_NEWNET, func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("unshare network namespace: %w", err)
			}
			return nil
		}, func() error {
			// Net sysctls are the writing thread's namespace's.
			for name, v := range map[string]int{
				"tcp_child_ehash_entries": childTCPBuckets,
				"udp_child_hash_entries":  childUDPBuckets,
			} {
				err := os.WriteFile("/proc/sys/net/ipv4/"+name, []byte(fmt.Sprint(v)), 0)
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				if err != nil {
					return fmt.Errorf("net.ipv4.%s: %w", name, err)
				}
			}
			var err error
			f, err = os.Open("/proc/thread-self/ns/net")
			return err
		})
		parent.f, parent.err = f, err
	})
	return parent.f, parent.err
}

// InNetParent runs fn on a locked OS thread from which new network
// namespaces (unshare, or a process started with CLONE_NEWNET) get small
// socket hash tables of their own (see childTCPBuckets). Anything else
// fn does should not depend on the thread's network namespace, which is
// an empty one.
func InNetParent(fn func() error) error {
	p, err := netParent()
	if err != nil {
		return err
	}
	if p == nil {
		return fn()
	}
	return Do(p, unix.CLONE_NEWNET, fn)
}

// NewNet creates a network namespace as a sandbox has it (loopback only,
// up, small socket tables) and returns a handle to it; the namespace
// lives as long as the handle or a process in it.
func NewNet() (*os.File, error) {
	refs, err := Fresh(unix.CLONE_NEWNET, "")
	if err != nil {
		return nil, err
	}
	return refs[0].File, nil
}

// Fresh creates new namespaces of the types in flags (CLONE_NEWNET,
// CLONE_NEWUTS, CLONE_NEWIPC), as a sandbox has them: the network one as
// NewNet makes it, the UTS one named hostname (when not ""), the IPC one
// empty.
func Fresh(flags int, hostname string) ([]Ref, error) {
	if flags&^(unix.CLONE_NEWNET|unix.CLONE_NEWUTS|unix.CLONE_NEWIPC) != 0 || flags == 0 {
		return nil, fmt.Errorf("new namespaces %#x: want net, uts or ipc", flags)
	}
	var p *os.File
	if flags&unix.CLONE_NEWNET != 0 {
		var err error
		if p, err = netParent(); err != nil {
			return nil, err
		}
	}
	var refs []Ref
	err := onThread(flags, func() error {
		// A network namespace is created from the parent one.
		if p != nil {
			if err := unix.Setns(int(p.Fd()), unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("setns net: %w", err)
			}
		}
		if err := unix.Unshare(flags); err != nil {
			return fmt.Errorf("unshare %s: %w", typeNames(flags), err)
		}
		return nil
	}, func() error {
		if flags&unix.CLONE_NEWNET != 0 {
			if err := LoopbackUp(); err != nil {
				return err
			}
		}
		if flags&unix.CLONE_NEWUTS != 0 && hostname != "" {
			if err := unix.Sethostname([]byte(hostname)); err != nil {
				return fmt.Errorf("sethostname: %w", err)
			}
		}
		var err error
		refs, err = openIn("/proc/thread-self/ns/", flags)
		return err
	})
	if err != nil {
		Close(refs)
		return nil, fmt.Errorf("new %s namespace: %w", typeNames(flags), err)
	}
	return refs, nil
}

func typeNames(flags int) string {
	var s []string
	for _, t := range types(flags) {
		s = append(s, names[t])
	}
	return strings.Join(s, "+")
}

// onThread runs enter and then fn on a locked OS thread, and puts the
// thread back into its namespaces of the types in flags afterwards.
func onThread(flags int, enter, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := openIn("/proc/thread-self/ns/", flags)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer Close(orig)
		back := func() error {
			for _, r := range orig {
				if err := unix.Setns(int(r.File.Fd()), r.Type); err != nil {
					return fmt.Errorf("return to the %s namespace: %w", names[r.Type], err)
				}
			}
			return nil
		}
		if err := enter(); err != nil {
			// enter failed before or after moving the thread: return it
			// either way.
			if back() == nil {
				runtime.UnlockOSThread()
			}
			errc <- err
			return
		}
		ferr := fn()
		if err := back(); err != nil {
			errc <- err
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// LoopbackUp brings the loopback interface of the calling thread's
// network namespace up.
func LoopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}
