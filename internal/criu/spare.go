package criu

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/ns"
)

// Spare is a CRIU started ahead of a restore, in new network (loopback
// up), UTS and IPC namespaces, waiting for its request. Images that leave
// any of these namespaces out join the spare's; images that carry them
// get new ones from CRIU. Whatever the caller does to
// it beforehand (moving it into the cgroups the restored tree belongs in:
// about 1.7 ms per hierarchy here, 12 ms for a sandbox's seven) is off
// the restore's critical path. A Spare serves one restore (see
// RestoreOptions.Spare) or is killed.
type Spare struct {
	mu sync.Mutex
	// Nil once used or killed.
	p *swrk // +checklocks:mu
}

// StartSpare starts a Spare, also in the namespaces join (which stay
// the caller's to close): a cgroup namespace the restored tree is to
// inherit.
func (t *Tool) StartSpare(join ...ns.Ref) (*Spare, error) {
	nss, err := ns.Fresh(SpareNamespaces, "")
	if err != nil {
		return nil, err
	}
	defer ns.Close(nss)
	p, err := t.spawn(nil, append(nss, join...))
	if err != nil {
		return nil, err
	}
	return &Spare{p: p}, nil
}

// StartSpareIn starts a Spare in the namespaces nss (which stay the
// caller's to close), for a dump of a tree that leaves them out of its
// images (DumpOptions.Spare).
func (t *Tool) StartSpareIn(nss []ns.Ref) (*Spare, error) {
	p, err := t.spawn(nil, nss)
	if err != nil {
		return nil, err
	}
	return &Spare{p: p}, nil
}

// SpareNamespaces are the namespaces a Spare runs in, new.
const SpareNamespaces = unix.CLONE_NEWNET | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC

// SetHostname names the spare's UTS namespace, which a tree restored
// from images without their own joins.
func (s *Spare) SetHostname(name string) error {
	pid := s.Pid()
	if pid == 0 {
		return errSpareGone
	}
	return ns.SetHostname(pid, name)
}

// Pid is the spare CRIU's PID (0 once used or killed).
func (s *Spare) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil {
		return 0
	}
	return s.p.cmd.Process.Pid
}

// Kill ends an unused Spare; it does nothing to a used one.
func (s *Spare) Kill() {
	if p := s.take(); p != nil {
		p.kill()
	}
}

// take hands out the started CRIU once; nil if it is gone.
func (s *Spare) take() *swrk {
	s.mu.Lock()
	p := s.p
	s.p = nil
	s.mu.Unlock()
	if p != nil && !p.running() {
		p.kill()
		return nil
	}
	return p
}

// running reports whether p's CRIU has not exited (without reaping it).
func (p *swrk) running() bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, p.cmd.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	return err == nil && info.Signo == 0
}

// errSpareGone is returned by a restore whose Spare was used or killed.
var errSpareGone = errors.New("the spare CRIU is gone")
