// Package ns runs code in Linux namespaces and makes the network
// namespace a sandbox has.
package ns

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

var names = map[int]string{unix.CLONE_NEWNET: "net", unix.CLONE_NEWUTS: "uts"}

// Do runs fn on a locked OS thread that has joined target, a namespace of
// type nstype (CLONE_NEWNET or CLONE_NEWUTS), then returns the thread to
// the caller's namespace. Processes fn starts from that thread (os/exec)
// are born in target. If the thread cannot return, it stays locked and
// dies with its goroutine, never reused.
func Do(target *os.File, nstype int, fn func() error) error {
	return onThread(nstype, func() error {
		if err := unix.Setns(int(target.Fd()), nstype); err != nil {
			return fmt.Errorf("setns %s: %w", names[nstype], err)
		}
		return nil
	}, fn)
}

// DoPid is Do in the namespace of process pid.
func DoPid(pid, nstype int, fn func() error) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/%s", pid, names[nstype]))
	if err != nil {
		return err
	}
	defer f.Close()
	return Do(f, nstype, fn)
}

// NewNet creates a network namespace as a sandbox has it (loopback only,
// up) and returns a handle to it; the namespace lives as long as the
// handle or a process in it.
func NewNet() (*os.File, error) {
	var f *os.File
	err := onThread(unix.CLONE_NEWNET, func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare network namespace: %w", err)
		}
		return nil
	}, func() (err error) {
		if err := LoopbackUp(); err != nil {
			return err
		}
		f, err = os.Open("/proc/thread-self/ns/net")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("new network namespace: %w", err)
	}
	return f, nil
}

// onThread runs enter and then fn on a locked OS thread, and puts the
// thread back into its namespace of type nstype afterwards.
func onThread(nstype int, enter, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/"+names[nstype], unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(orig)
		if err := enter(); err != nil {
			// enter failed before or after moving the thread: return it
			// either way.
			if unix.Setns(orig, nstype) == nil {
				runtime.UnlockOSThread()
			}
			errc <- err
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, nstype); err != nil {
			errc <- fmt.Errorf("return to the %s namespace: %w", names[nstype], err)
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
