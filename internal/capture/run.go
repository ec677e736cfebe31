package capture

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/ns"
)

// NetworkLock is how CRIU keeps a sandbox's TCP connections quiet during
// a dump and a restore: not at all. A sandbox's network namespace holds
// only loopback, so both ends of every connection are processes of the
// sandbox, frozen for the dump or not yet running during the restore:
// no packet can arrive. Locking with nftables (CRIU's library, no
// programs needed) costs 17-20 ms of every frozen window here.
const NetworkLock = "skip"

// Target is the sandbox a capture takes, and what the capture needs of
// its owner (the daemon's Manager) on the way.
type Target struct {
	Pid      int            // the tree's init (host PID)
	Cgroup   *cgroup.Cgroup // the sandbox's cgroup, frozen for the capture
	Tool     *criu.Tool
	Strategy Strategy // Plan's
	// Staging receives the images, Work is CRIU's work directory (it
	// holds Staging when the staging is not a tmpfs of its own).
	Staging, Work string
	// Release removes Staging and Work. Run owns it from its call on:
	// a failed Run has called it, a Captured calls it on Close.
	Release func()
	// Deadline bounds each frozen window (Deadline; 0: none).
	Deadline time.Duration
	// Pids lists the live tree's processes (the cgroup also holds the
	// sandbox's standbys, which are not dumped).
	Pids func() ([]int, error)
	// Snapshot takes the root's read-only snapshot as the checkpoint's
	// files, in the frozen window, on a goroutine of its own.
	Snapshot func() error
	// Pipes returns the host's stream pipes (copy-on-write), called
	// only for a streamed dump.
	Pipes func() *criu.PipePool
	// Spare returns a CRIU started ahead in the sandbox's namespaces of
	// the types in outside, or nil (then a new CRIU runs).
	Spare func(outside int) *criu.Spare
	// ReserveCopies makes room in the sandbox's limits for the copies
	// of a template capture; release gives it back once they are gone.
	ReserveCopies func() (release func(), err error)
	// HoldFrozen leaves the cgroup frozen after a successful capture.
	HoldFrozen bool
	// Frozen, if set, is called at the instant, the tree still frozen.
	Frozen   func()
	LogLevel int // CRIU's
	// Fail and Crash are the owner's failpoints and crash points (tests);
	// nil for none.
	Fail  func(step string) error
	Crash func(step string)
}

func (t *Target) fail(step string) error {
	if t.Fail == nil {
		return nil
	}
	return t.Fail(step)
}

func (t *Target) crash(step string) {
	if t.Crash != nil {
		t.Crash(step)
	}
}

// Captured is a tree captured at one instant, the sandbox running on:
// its images in the staging directory, complete once Finish returns.
// It owns the staging and work directories, the image stream holding
// the pages of a copy-on-write capture and the copies of a template
// capture, and releases them on Close. Its owner hands it over with
// Hand, after which its own Close does nothing. One owner at a time
// uses it.
type Captured struct {
	Mode    string // Template, COW or Copy: what was done
	Note    string // why not a better mode (v1.Checkpoint.CaptureNote)
	Outside int    // the namespace types left out of the images
	// Stall is the frozen window, freeze to thaw, and Parts its parts.
	Stall time.Duration
	Parts v1.StallParts

	streamed bool
	o        *owned
}

// owned is what a Captured releases.
type owned struct {
	t      Target // staging, work, Release and what the copies' dumps need
	stream *criu.Stream
	copies *treeCopy
	room   func() // gives back the copies' room
	// dumped is closed once the copies' dumps (Start) are over, with
	// their error in dumpErr.
	dumped  chan struct{}
	dumpErr error
}

// Staging is the directory that holds the images.
func (c *Captured) Staging() string { return c.o.t.Staging }

// Start dumps the copies of a template capture in the background, at
// once: until they are dumped, the copies are processes of the sandbox.
// done, if set, is called once they are gone. Nothing happens for the
// other modes.
func (c *Captured) Start(done func()) {
	o := c.o
	if o == nil || o.copies == nil || o.dumped != nil {
		return
	}
	tc, room, outside := o.copies, o.room, c.Outside
	o.copies, o.room = nil, nil
	o.dumped = make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), criu.DefaultTimeout)
		defer cancel()
		o.dumpErr = dumpCopies(ctx, &o.t, tc, outside)
		if room != nil {
			room()
		}
		if done != nil {
			done()
		}
		close(o.dumped)
	}()
}

// Finish completes the images in Staging: it waits for the dumps of the
// copies (Template) or writes out the pages the stream holds (COW),
// releasing them. The staging stays until Close.
func (c *Captured) Finish() error {
	o := c.o
	var err error
	if o.dumped != nil {
		<-o.dumped
		if err = o.dumpErr; err != nil {
			err = fmt.Errorf("dump the copies: %w", err)
		}
	}
	if o.stream != nil {
		// The pages it holds are copied now, off the frozen window.
		if err = o.t.fail("full:stream"); err == nil {
			err = o.stream.WriteTo()
		}
		o.stream.Close()
		o.stream = nil
	}
	return err
}

// Streamed says whether CRIU streamed the images: their pipes left the
// host's pool.
func (c *Captured) Streamed() bool { return c.streamed }

// Hand transfers what c owns to the returned Captured: c's Close does
// nothing from then on.
func (c *Captured) Hand() *Captured {
	n := &Captured{Mode: c.Mode, Note: c.Note, Outside: c.Outside, Stall: c.Stall, Parts: c.Parts, streamed: c.streamed, o: c.o}
	c.o = nil
	return n
}

// Close releases what c owns: the copies (killed, their room given
// back) or their dumps (waited for), the stream, and the staging and
// work directories. It may be called again.
func (c *Captured) Close() {
	o := c.o
	if o == nil {
		return
	}
	c.o = nil
	if o.dumped != nil {
		<-o.dumped
	}
	o.copies.close()
	if o.room != nil {
		o.room()
	}
	if o.stream != nil {
		o.stream.Close()
	}
	if o.t.Release != nil {
		o.t.Release()
	}
}

// Run captures the tree of t at one instant (one freeze of its cgroup)
// the way t.Strategy says, falling back as Strategy.Mode says, and
// thaws it (unless t.HoldFrozen). On failure the sandbox is thawed and
// everything t handed over is released.
func Run(ctx context.Context, t Target) (_ *Captured, err error) {
	st := t.Strategy
	c := &Captured{Mode: Copy, Outside: st.Outside, o: &owned{t: t}}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	var freezeStart time.Time
	var snapped chan error
	capt := state{stream: st.Stream, mode: Copy, note: st.Note}
	// CRIU or ptrace that hangs does not keep the sandbox frozen
	// (frozen.go): the work in the frozen window runs under wctx.
	wctx, fw := WatchFrozen(ctx, t.Cgroup, t.Deadline)
	defer fw.Stop()
	capt.watch = fw
	outside := st.Outside
	cg := t.Cgroup
	var tc *treeCopy
	if st.Mode == Template {
		// The copies are not the sandbox's: room for them first; it goes
		// when they are gone.
		var room func()
		var rerr error
		if t.ReserveCopies != nil {
			room, rerr = t.ReserveCopies()
		}
		if rerr != nil {
			capt.note = "no room for the copies: " + rerr.Error()
		} else {
			c.o.room = room
			freezeStart, snapped, tc, err = copyTree(wctx, &t, outside, &capt)
			c.o.copies = tc
			switch {
			case err == nil:
				capt.mode, capt.stream = Template, false
			case errors.Is(err, errNoTemplate), errors.Is(err, errIPCAppeared):
				if errors.Is(err, errIPCAppeared) {
					outside &^= unix.CLONE_NEWIPC
				}
				if terr := cg.Thaw(); terr != nil {
					return nil, errors.Join(err, fmt.Errorf("thaw: %w", terr))
				}
				fw.Disarm()
				capt.note = err.Error()
				capt.parts = v1.StallParts{}
				freezeStart, err = time.Time{}, nil
			}
		}
	}
	var stream *criu.Stream
	for tc == nil && err == nil {
		freezeStart, snapped, stream, err = dumpTree(wctx, &t, outside, &capt)
		c.o.stream = stream
		if !errors.Is(err, errIPCAppeared) {
			break
		}
		// An IPC object appeared before the freeze: dump with the
		// namespace (and without the stream, whose files may be there).
		if terr := cg.Thaw(); terr != nil {
			return nil, errors.Join(err, fmt.Errorf("thaw: %w", terr))
		}
		fw.Disarm()
		outside &^= unix.CLONE_NEWIPC
		if stream != nil {
			stream.Close()
			stream, c.o.stream = nil, nil
			if err := clearDir(t.Staging); err != nil {
				return nil, err
			}
		}
		capt = state{mode: Copy, note: "retried with the IPC namespace", watch: fw}
		err = nil
	}
	if err != nil {
		err = fmt.Errorf("dump: %w", err)
	}
	if snapped != nil {
		fw.Enter("the root's snapshot")
		if serr := <-snapped; serr != nil {
			err = errors.Join(err, fmt.Errorf("snapshot: %w", serr))
		} else if err == nil {
			err = t.fail("full:snapshot")
		}
	}
	if derr := fw.Stop(); derr != nil {
		if err != nil {
			derr = fmt.Errorf("%w (%v)", derr, err)
		}
		err = derr
	}
	if err == nil && t.Frozen != nil {
		t.Frozen()
	}
	if freezeStart.IsZero() {
		freezeStart = time.Now()
	}
	// CRIU leaves a cgroup it froze frozen; so does a failed dump.
	if err != nil || !t.HoldFrozen {
		if terr := cg.Thaw(); terr != nil {
			return nil, errors.Join(err, fmt.Errorf("thaw: %w", terr))
		}
	}
	c.Stall = time.Since(freezeStart)
	if err != nil {
		return nil, err
	}
	c.Mode, c.Note, c.Outside, c.Parts = capt.mode, capt.note, outside, capt.parts
	c.streamed = stream != nil
	if c.Mode != Template && c.o.room != nil {
		// Copies made and let go in the window: their room goes now.
		c.o.room()
		c.o.room = nil
	}
	return c, nil
}

// startSnapshot starts snap (the root's read-only snapshot) on a
// goroutine of its own; its result arrives on the channel, and its time
// in capt's stall parts before that.
func startSnapshot(snap func() error, capt *state) chan error {
	snapped := make(chan error, 1)
	go func() {
		t0 := time.Now()
		err := snap()
		capt.parts.SnapshotMS = ms(time.Since(t0))
		snapped <- err
	}()
	return snapped
}

// errIPCAppeared fails a dump that left the IPC namespace out when the
// frozen sandbox turns out to hold System V objects after all.
var errIPCAppeared = errors.New("the sandbox made System V IPC objects before the freeze")

// dumpTree runs CRIU on the sandbox's tree, in the sandbox's namespaces
// of the types in outside (left out of the images). At CRIU's pre-dump
// notification it freezes the cgroup and starts the root's read-only
// snapshot, whose result arrives on snapped (nil if it never started);
// CRIU dumps the frozen tree meanwhile. The cgroup is left frozen.
func dumpTree(ctx context.Context, t *Target, outside int, capt *state) (freezeStart time.Time, snapped chan error, stream *criu.Stream, err error) {
	cg := t.Cgroup
	// A CRIU started ahead in those namespaces (after the sandbox's
	// previous checkpoint), or a new one. A streamed dump runs its own
	// (criu.Stream).
	var spare *criu.Spare
	if capt.stream {
		if stream, err = criu.Listen(t.Staging, t.Pipes()); err != nil {
			return freezeStart, nil, nil, err
		}
	} else if t.Spare != nil {
		spare = t.Spare(outside)
	}
	var nss []ns.Ref
	if spare == nil && outside != 0 {
		if nss, err = ns.Open(t.Pid, outside); err != nil {
			return freezeStart, nil, stream, err
		}
		defer ns.Close(nss)
	}
	ds, err := t.Tool.Dump(ctx, criu.DumpOptions{
		Pid: t.Pid, ImagesDir: t.Staging, WorkDir: t.Work, LeaveRunning: true,
		TCPEstablished: true, FileLocks: true, NetworkLock: NetworkLock,
		FreezeCgroup: cg.FreezerDir(), CgroupMode: "ignore", Namespaces: nss, Spare: spare, LogLevel: t.LogLevel,
		Stream: stream,
		PreDump: func() error {
			freezeStart = time.Now()
			capt.watch.Arm("the freeze")
			if err := cg.Freeze(ctx); err != nil {
				return err
			}
			if outside&unix.CLONE_NEWIPC != 0 {
				if inUse, err := sysvIPCInUse(t.Pid); err != nil {
					return err
				} else if inUse {
					return errIPCAppeared
				}
			}
			if stream != nil {
				capt.watch.Enter("the copy-on-write protection")
				if err := protect(ctx, t, stream, capt); err != nil {
					return err
				}
				stream.Hold(capt.mode == COW)
			}
			// The snapshot (a btrfs transaction commit, 3-5 ms on a
			// quiet pool) runs while CRIU dumps: nothing writes to the
			// root until the thaw, which waits for it. It starts after
			// the write protection: started next to it, on two CPUs, it
			// took CPU from the protection's fork and exit, which the
			// stall waits for, and gained nothing over CRIU, which takes
			// longer than it anyway (stall p50 36 / 48 ms against 38 /
			// 36 ms, 10 checkpoints each). The writable copy a rollback
			// takes is made from it later, in persist: a second
			// snapshot here would serialize behind the first.
			snapped = startSnapshot(t.Snapshot, capt)
			capt.watch.Enter("CRIU's dump")
			return nil
		},
	})
	capt.parts.CRIUMS = ds.FrozenMS
	if stream != nil {
		if serr := stream.Finish(); serr != nil && err == nil {
			err = serr
		}
	}
	if freezeStart.IsZero() {
		freezeStart = time.Now()
	}
	return freezeStart, snapped, stream, err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
