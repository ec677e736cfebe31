package inspect

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
)

// Options configures an Inspector.
type Options struct {
	// RingBytes is the size of the BPF ring buffer shared by all watches.
	// It is rounded up to a power of two of at least one page. Default 8 MiB.
	RingBytes int
}

const defaultRingBytes = 8 << 20

// ErrClosed is returned by operations on a closed Inspector or Watch.
var ErrClosed = errors.New("inspect: closed")

// Inspector owns the loaded BPF programs, their maps and the single reader
// of the ring buffer. One Inspector serves any number of watches.
type Inspector struct {
	objs  inspectObjects
	links []link.Link
	progs []*ebpf.Program
	rd    *ringbuf.Reader
	done  chan struct{} // closed when the reader goroutine exits

	mu sync.Mutex
	// By cgroup id.
	watches map[uint64]*Watch // +checklocks:mu
	// Generation numbers are unique across watches.
	nextGen uint32 // +checklocks:mu
	// Barrier requests made.
	reqSeq  uint64          // +checklocks:mu
	waiters []barrierWaiter // +checklocks:mu
	// Why the reader stopped, once it has.
	readerErr error // +checklocks:mu
	closed    bool  // +checklocks:mu
	closeOnce sync.Once

	// testDispatchDelay slows the reader down (tests of the Cut barrier).
	testDispatchDelay atomic.Int64
}

type barrierWaiter struct {
	seq uint64
	ch  chan error
}

// Open loads the BPF programs and attaches them. It needs root (or
// CAP_BPF+CAP_PERFMON+CAP_SYS_ADMIN), a kernel with BTF
// (/sys/kernel/btf/vmlinux) and BPF ring buffers (5.8+; tp_btf, bpf_loop and
// bpf_find_vma need 5.17+, the sched_process_exit group_dead argument 6.16+).
func Open(opts Options) (*Inspector, error) {
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return nil, fmt.Errorf("inspect: kernel BTF not available (%v): the kernel needs CONFIG_DEBUG_INFO_BTF=y", err)
	}
	ring := opts.RingBytes
	if ring <= 0 {
		ring = defaultRingBytes
	}
	ring = ringSize(ring)

	// Needed before 5.11 (memlock accounting); harmless afterwards.
	if err := rlimit.RemoveMemlock(); err != nil && !errors.Is(err, syscall.EPERM) {
		return nil, fmt.Errorf("inspect: raising RLIMIT_MEMLOCK: %w", err)
	}

	spec, err := loadInspect()
	if err != nil {
		return nil, fmt.Errorf("inspect: parsing embedded BPF object: %w", err)
	}
	if m, ok := spec.Maps["events"]; ok {
		m.MaxEntries = uint32(ring)
	}

	in := &Inspector{
		watches: make(map[uint64]*Watch),
		done:    make(chan struct{}),
		nextGen: 1,
	}
	if err := spec.LoadAndAssign(&in.objs, nil); err != nil {
		return nil, loadError(err)
	}
	in.progs = []*ebpf.Program{
		in.objs.SysEnter, in.objs.SysExit,
		in.objs.SchedProcessFork, in.objs.SchedProcessExec, in.objs.SchedProcessExit,
	}
	// Attached once to find out whether they can be, then only while
	// something is watched: every system call on the host runs them.
	if err := in.attachLocked(); err != nil {
		in.closeObjects()
		return nil, err
	}
	in.detachLocked()
	rd, err := ringbuf.NewReader(in.objs.Events)
	if err != nil {
		in.closeObjects()
		return nil, fmt.Errorf("inspect: opening ring buffer reader: %w", err)
	}
	in.rd = rd
	go in.readLoop()
	return in, nil
}

func ringSize(n int) int {
	size := os.Getpagesize()
	for size < n {
		size <<= 1
	}
	return size
}

func loadError(err error) error {
	var ve *ebpf.VerifierError
	switch {
	case errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES):
		return fmt.Errorf("inspect: loading BPF objects: permission denied (needs root or CAP_BPF+CAP_PERFMON+CAP_SYS_ADMIN, and kernel.unprivileged_bpf_disabled does not help here): %w", err)
	case errors.As(err, &ve):
		return fmt.Errorf("inspect: BPF verifier rejected the programs (kernel too old or incompatible): %w", err)
	case errors.Is(err, ebpf.ErrNotSupported):
		return fmt.Errorf("inspect: kernel lacks a required BPF feature (ring buffer, tp_btf, bpf_loop, bpf_find_vma): %w", err)
	default:
		return fmt.Errorf("inspect: loading BPF objects (CO-RE against /sys/kernel/btf/vmlinux): %w", err)
	}
}

func attachError(p *ebpf.Program, err error) error {
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		return fmt.Errorf("inspect: attaching %s: permission denied (needs root or CAP_BPF+CAP_PERFMON): %w", p, err)
	}
	return fmt.Errorf("inspect: attaching %s as tp_btf raw tracepoint: %w", p, err)
}

// attachLocked attaches the programs unless they are. Caller holds in.mu
// (or owns in alone).
func (in *Inspector) attachLocked() error {
	if len(in.links) > 0 {
		return nil
	}
	for _, p := range in.progs {
		l, err := link.AttachTracing(link.TracingOptions{Program: p, AttachType: ebpf.AttachTraceRawTp})
		if err != nil {
			in.detachLocked()
			return attachError(p, err)
		}
		in.links = append(in.links, l)
	}
	return nil
}

// detachLocked detaches the programs. Caller holds in.mu (or owns in
// alone).
func (in *Inspector) detachLocked() {
	for _, l := range in.links {
		l.Close()
	}
	in.links = nil
}

func (in *Inspector) closeObjects() {
	for _, l := range in.links {
		l.Close()
	}
	in.links = nil
	in.objs.Close()
}

// Close detaches the programs, stops the reader and fails pending Cuts.
// Watches become unusable.
func (in *Inspector) Close() error {
	var err error
	in.closeOnce.Do(func() {
		in.mu.Lock()
		in.closed = true
		in.mu.Unlock()
		for _, l := range in.links {
			if e := l.Close(); e != nil && err == nil {
				err = e
			}
		}
		in.links = nil
		if e := in.rd.Close(); e != nil && err == nil {
			err = e
		}
		<-in.done
		if e := in.objs.Close(); e != nil && err == nil {
			err = e
		}
	})
	return err
}

// readLoop is the only consumer of the ring buffer.
func (in *Inspector) readLoop() {
	defer close(in.done)
	var rec ringbuf.Record
	for {
		in.mu.Lock()
		served := in.reqSeq
		in.mu.Unlock()

		err := in.rd.ReadInto(&rec)
		switch {
		case err == nil:
			in.dispatch(rec.RawSample)
		case errors.Is(err, ringbuf.ErrFlushed):
			// The ring was empty at a moment after this ReadInto began,
			// which is after every request <= served was made.
			in.mu.Lock()
			in.completeLocked(served, nil)
			more := in.reqSeq > served
			in.mu.Unlock()
			if more {
				// Its Flush may have been coalesced with the one
				// just consumed: wake ourselves once more.
				in.rd.Flush()
			}
		default:
			if errors.Is(err, os.ErrClosed) {
				err = ErrClosed
			} else {
				err = fmt.Errorf("inspect: reading ring buffer: %w", err)
			}
			in.mu.Lock()
			in.readerErr = err
			in.completeLocked(^uint64(0), err)
			in.mu.Unlock()
			return
		}
	}
}

// +checklocks:in.mu
func (in *Inspector) completeLocked(upTo uint64, err error) {
	keep := in.waiters[:0]
	for _, w := range in.waiters {
		if w.seq <= upTo {
			w.ch <- err
		} else {
			keep = append(keep, w)
		}
	}
	in.waiters = keep
}

// barrier returns a channel that receives once everything committed to the
// ring before the call has been dispatched.
//
// +checklocks:in.mu
func (in *Inspector) barrierLocked() (<-chan error, error) {
	if in.readerErr != nil {
		return nil, in.readerErr
	}
	if in.closed {
		return nil, ErrClosed
	}
	in.reqSeq++
	ch := make(chan error, 1)
	in.waiters = append(in.waiters, barrierWaiter{seq: in.reqSeq, ch: ch})
	return ch, nil
}

func (in *Inspector) dispatch(raw []byte) {
	if d := in.testDispatchDelay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	ev, err := parseEvent(raw)
	if err != nil {
		return
	}
	in.mu.Lock()
	w := in.watches[ev.cgid]
	in.mu.Unlock()
	if w == nil {
		return
	}
	w.apply(ev)
}

// recursionMisses is the number of times the kernel skipped one of our
// programs (another BPF program was running on that CPU). Those runs may
// have carried events for any watch.
func (in *Inspector) recursionMisses() uint64 {
	var n uint64
	for _, p := range in.progs {
		st, err := p.Stats()
		if err != nil {
			continue
		}
		n += st.RecursionMisses
	}
	return n
}

// updateLevelsLocked recomputes the bitmask of cgroup levels that have a
// watched cgroup, used by the programs to attribute tasks in descendant
// cgroups to their watched ancestor.
//
// +checklocks:in.mu
func (in *Inspector) updateLevelsLocked() error {
	var mask uint64
	for _, w := range in.watches {
		if w.level > 0 && w.level < 24 {
			mask |= 1 << w.level
		}
	}
	return in.objs.Levels.Update(uint32(0), mask, ebpf.UpdateAny)
}
