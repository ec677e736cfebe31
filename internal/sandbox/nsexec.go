package sandbox

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

var nsNames = map[int]string{unix.CLONE_NEWNET: "net", unix.CLONE_NEWUTS: "uts"}

// inNamespace runs fn on a locked OS thread that has joined the namespace
// of type nstype (CLONE_NEWNET or CLONE_NEWUTS) of process pid, then
// returns the thread to the daemon's namespace. If the thread cannot
// return, it stays locked and dies with its goroutine, never reused.
func inNamespace(pid, nstype int, fn func() error) error {
	name := nsNames[nstype]
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		target, err := unix.Open(fmt.Sprintf("/proc/%d/ns/%s", pid, name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(target)
		orig, err := unix.Open("/proc/thread-self/ns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(target, nstype); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", name, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, nstype); err != nil {
			errc <- fmt.Errorf("return to the daemon's %s namespace: %w", name, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
