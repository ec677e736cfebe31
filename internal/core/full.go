package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/hot"
	"github.com/molt-sh/molt/internal/ns"
	"github.com/molt-sh/molt/internal/pagestore"
	"github.com/molt-sh/molt/internal/revert"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/sched"
	"github.com/molt-sh/molt/internal/store"
	"golang.org/x/sys/unix"
)

// ckImages is the directory of checkpoint id's process images.
func (m *Manager) ckImages(id string) string { return m.cks.Images(id) }

// networkLock is how CRIU keeps a sandbox's TCP connections quiet during
// a dump and a restore: not at all. A sandbox's network namespace holds
// only loopback, so both ends of every connection are processes of the
// sandbox, frozen for the dump or not yet running during the restore:
// no packet can arrive. Locking with nftables (CRIU's library, no
// programs needed) costs 17-20 ms of every frozen window here.
const networkLock = "skip"

// criuReady returns the CRIU tool, or why full checkpoints cannot be
// taken here.
func (m *Manager) criuReady(ctx context.Context) (*criu.Tool, error) {
	if m.criu == nil {
		return nil, fmt.Errorf("process checkpoints need CRIU >= 4.2 (run scripts/criu.sh): %w", errdefs.ErrNotSupported)
	}
	f := m.criu.Probe(ctx)
	if !f.VersionOK || !f.Check || f.SelfTest != nil {
		return nil, fmt.Errorf("process checkpoints are unavailable: %s: %w", criuProblem(f), errdefs.ErrNotSupported)
	}
	return m.criu, nil
}

func criuProblem(f criu.Features) string {
	switch {
	case !f.VersionOK:
		return fmt.Sprintf("CRIU %s is older than 4.2 (run scripts/criu.sh)", f.Version)
	case !f.Check:
		return "criu check failed: " + f.CheckOutput
	case f.SelfTest != nil:
		return "CRIU self-test failed: " + f.SelfTest.Error()
	}
	return ""
}

// fullCheckpointLocked takes a full checkpoint: files and every process
// of the sandbox at one instant (one freeze of its cgroup). CRIU dumps to
// a staging directory in memory; after the thaw it returns the
// checkpoint pending, and persist stores the images through the page
// store, writes the manifest and commits, in the background.
func (m *Manager) fullCheckpointLocked(ctx context.Context, rec sandboxRec, o ckOpts) (v1.Checkpoint, error) {
	label, keep := o.label, o.keep
	start := time.Now()
	tool, err := m.criuReady(ctx)
	if err != nil {
		return v1.Checkpoint{}, err
	}
	if m.report(rec).State != v1.StateRunning {
		return v1.Checkpoint{}, fmt.Errorf("a full checkpoint needs a running sandbox (it is %s; take an fs checkpoint): %w", m.report(rec).State, errdefs.ErrFailedPrecondition)
	}
	m.enforceLimits(&rec, "checkpoint")
	id := newID()
	root := m.sbRoot(rec.ID)
	r := revert.New()
	defer r.Fail()
	if _, err := m.cks.Create(id); err != nil {
		return v1.Checkpoint{}, err
	}
	r.Add(func() error { return m.cks.Delete(id) })
	work := m.path("tmp", "dump-"+id)
	if err := os.Mkdir(work, 0o700); err != nil {
		return v1.Checkpoint{}, err
	}
	keepStaging := false // handed to the background persist
	defer func() {
		if !keepStaging {
			os.RemoveAll(work)
		}
	}()
	staging, err := m.stagingDir(work, stagingBound(rec))
	if err != nil {
		return v1.Checkpoint{}, err
	}
	defer func() {
		if !keepStaging {
			removeStaging(staging)
		}
	}()
	// One instant for files and processes: freeze the cgroup (cgroup2,
	// about a millisecond), snapshot the root, let CRIU dump the frozen
	// tree (it freezes through the same cgroup, so it does not stop each
	// task with ptrace), thaw. Stall: freeze to thaw.
	cg, err := cgroup.Load(cgroupName(rec.ID))
	if err != nil {
		return v1.Checkpoint{}, err
	}
	// In a user namespace CRIU (host root, the namespace's owner) holds
	// every capability, CAP_SYS_RESOURCE included: any user dumps.
	if !rec.IDs.Enabled() {
		if err := checkDumpable(cg); err != nil {
			return v1.Checkpoint{}, err
		}
	}
	if err := m.quiet(rec.ID, time.Second); err != nil {
		return v1.Checkpoint{}, err
	}
	if why := tracedObstacle(rec.Init.Pid); why != "" {
		return v1.Checkpoint{}, fmt.Errorf("%s: %w", why, errdefs.ErrFailedPrecondition)
	}
	// From the syncfs to the thaw no background commit of the pool
	// starts (commitgate.go).
	releaseCommits, err := m.commits.foreground(ctx)
	if err != nil {
		return v1.Checkpoint{}, err
	}
	defer releaseCommits()
	if err := fsnap.SyncFS(root); err != nil {
		return v1.Checkpoint{}, err
	}
	// CRIU starts (tens of milliseconds) before the freeze: the freeze
	// and the snapshot run at its pre-dump notification.
	// The sandbox's network, UTS and (when it holds no System V objects)
	// IPC namespaces stay out of the images, and so do its cgroups: CRIU
	// runs in those namespaces (a tree in CRIU's own namespace leaves it
	// out), and a restore gives the tree fresh ones and the sandbox's
	// cgroup. Dumping them took about 40 ms of the frozen window here (a
	// fork of CRIU per namespace, the host's connection-tracking table
	// scanned twice, the cgroups). Nothing inside a sandbox can configure
	// them (no CAP_NET_ADMIN or CAP_SYS_ADMIN, /proc/sys read-only), so
	// fresh ones equal the dumped ones: loopback up, the sandbox's
	// hostname, no IPC objects.
	outside := unix.CLONE_NEWNET | unix.CLONE_NEWUTS
	inUse, err := sysvIPCInUse(rec.Init.Pid)
	if err != nil {
		return v1.Checkpoint{}, err
	}
	if !inUse {
		outside |= unix.CLONE_NEWIPC
	}
	if m.netnsInImages {
		outside = 0
	}
	if err := m.fail("full:namespaces"); err != nil {
		return v1.Checkpoint{}, err
	}
	var freezeStart time.Time
	var snapped chan error
	// A tree with much private memory is captured copy-on-write when it
	// can be (cow.go); CRIU then streams its images to the daemon.
	capt := capture{mode: captureCopy}
	// The live tree's memory: standbys in the cgroup are not dumped.
	pids, _, perr := treePids(rec.ID, rec.Init)
	var anon int64
	if perr == nil {
		anon = anonBytes(pids)
	}
	big := perr == nil && anon >= cowMinAnon && !o.holdFrozen
	// CRIU or ptrace that hangs does not keep the sandbox frozen
	// (frozen.go): the work in the frozen window runs under wctx.
	wctx, fw := watchFrozen(ctx, cg, m.frozenDeadline(anon))
	defer fw.stop()
	capt.watch = fw
	if big && !m.cfg.NoCOWCapture {
		capt.stream = true
	}
	var stream *criu.Stream
	defer func() {
		if stream != nil {
			stream.Close()
		}
	}()
	// Better still, a tree that can be copied is copied in the frozen
	// window and dumped after the thaw (copies.go); one found not to be
	// once frozen is thawed and captured the other way.
	var tc *treeCopy
	defer func() { tc.close() }()
	if big && !m.cfg.NoTemplateCapture {
		if why := templateObstacle(rec.Init.Pid, pids); why != "" {
			capt.note = why
		} else if rerr := m.reserveRoom(rec, copiesRoom(id), room{mem: anonBytes(pids), pids: int64(len(pids))}); rerr != nil {
			capt.note = "no room for the copies: " + rerr.Error()
		} else {
			// The copies are not the sandbox's: room for them first
			// (limits.go); it goes when they are gone.
			defer func() {
				if tc != nil || capt.mode != captureTemplate {
					tc.close()
					m.releaseRoom(rec.ID, copiesRoom(id))
				}
			}()
			freezeStart, snapped, tc, err = m.copyTree(wctx, rec, cg, id, outside, &capt)
			if tc != nil {
				tc.room = copiesRoom(id)
			}
			switch {
			case err == nil:
				capt.mode, capt.stream = captureTemplate, false
			case errors.Is(err, errNoTemplate), errors.Is(err, errIPCAppeared):
				if errors.Is(err, errIPCAppeared) {
					outside &^= unix.CLONE_NEWIPC
				}
				if terr := cg.Thaw(); terr != nil {
					return v1.Checkpoint{}, errors.Join(err, fmt.Errorf("thaw: %w", terr))
				}
				fw.disarm()
				capt.note = err.Error()
				capt.parts = v1.StallParts{}
				freezeStart, err = time.Time{}, nil
			}
		}
	}
	for tc == nil && err == nil {
		freezeStart, snapped, stream, err = m.dumpTree(wctx, tool, rec, cg, id, staging, work, outside, &capt)
		if !errors.Is(err, errIPCAppeared) {
			break
		}
		// An IPC object appeared before the freeze: dump with the
		// namespace (and without the stream, whose files may be there).
		if terr := cg.Thaw(); terr != nil {
			return v1.Checkpoint{}, errors.Join(err, fmt.Errorf("thaw: %w", terr))
		}
		fw.disarm()
		outside &^= unix.CLONE_NEWIPC
		if stream != nil {
			stream.Close()
			stream = nil
			if err := clearDir(staging); err != nil {
				return v1.Checkpoint{}, err
			}
		}
		capt = capture{mode: captureCopy, note: "retried with the IPC namespace", watch: fw}
		err = nil
	}
	if err != nil {
		err = fmt.Errorf("dump: %w", err)
	}
	if snapped != nil {
		fw.enter("the root's snapshot")
		if serr := <-snapped; serr != nil {
			err = errors.Join(err, fmt.Errorf("snapshot: %w", serr))
		} else if err == nil {
			err = m.fail("full:snapshot")
		}
	}
	if derr := fw.stop(); derr != nil {
		if err != nil {
			derr = fmt.Errorf("%w (%v)", derr, err)
		}
		err = derr
	}
	if err == nil && o.frozen != nil {
		o.frozen()
	}
	if freezeStart.IsZero() {
		freezeStart = time.Now()
	}
	// CRIU leaves a cgroup it froze frozen; so does a failed dump.
	if err != nil || !o.holdFrozen {
		if terr := cg.Thaw(); terr != nil {
			return v1.Checkpoint{}, errors.Join(err, fmt.Errorf("thaw: %w", terr))
		}
	}
	stall := time.Since(freezeStart)
	releaseCommits()
	if err != nil {
		return v1.Checkpoint{}, err
	}
	if !o.holdFrozen {
		m.refillDumpSpare(rec, outside)
	}
	ck := checkpointRec{Checkpoint: v1.Checkpoint{
		ID: id, Sandbox: rec.ID, Parent: rec.Head, Kind: v1.KindFull, Label: label,
		Created: time.Now().UTC(), StallMS: ms(stall), Keep: keep,
		Capture: capt.mode, CaptureNote: capt.note,
		StallParts: &capt.parts,
	}, Image: rec.Image, CRIU: tool.Probe(ctx).Version, ExternalNet: outside&unix.CLONE_NEWNET != 0,
		ExternalUTS: outside&unix.CLONE_NEWUTS != 0, ExternalIPC: outside&unix.CLONE_NEWIPC != 0, IDs: rec.IDs}
	// The consistent instant is captured and the sandbox runs on. The
	// rest (storing the images, the manifest, the commit) runs in the
	// background: the checkpoint is pending until committed. The sandbox
	// moves its head at once, so the next checkpoint is its child.
	rec.Head = id
	if err := m.db.Put(store.Sandboxes, rec.ID, rec); err != nil {
		return v1.Checkpoint{}, err
	}
	job := m.pipe.add(ck)
	r.Success()
	keepStaging = true
	held := stream
	stream = nil // persist writes it out and closes it
	var copied <-chan error
	if tc != nil {
		// The copies are dumped into staging from now on; persist waits
		// for them.
		copied = m.startDumpCopies(tool, rec, tc, staging, work, outside)
		tc = nil
	}
	m.background(rec.ID, sched.Persist, "persist "+ck.ID, func(ctx context.Context, t *sched.Task) error {
		m.persist(ctx, t, job, rec, staging, work, held, copied, start)
		return job.err
	})
	ck.Pending = true
	ck.DurationMS = ms(time.Since(start))
	return ck.Checkpoint, nil
}

// startSnapshot starts the read-only snapshot of the sandbox root root
// as checkpoint id's files; its result arrives on the channel, and its
// time in capt's stall parts before that.
func (m *Manager) startSnapshot(root, id string, groups []uint64, capt *capture) chan error {
	snapped := make(chan error, 1)
	go func() {
		t0 := time.Now()
		err := snapshotRoot(root, m.ckFS(id), groups)
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
func (m *Manager) dumpTree(ctx context.Context, tool *criu.Tool, rec sandboxRec, cg *cgroup.Cgroup, id, staging, work string, outside int, capt *capture) (freezeStart time.Time, snapped chan error, stream *criu.Stream, err error) {
	// A CRIU started ahead in those namespaces (after the sandbox's
	// previous checkpoint), or a new one. A streamed dump runs its own
	// (criu.Stream).
	var spare *criu.Spare
	if capt.stream {
		if stream, err = criu.Listen(staging, m.pipePool()); err != nil {
			return freezeStart, nil, nil, err
		}
	} else {
		spare = m.takeDumpSpare(rec, outside)
	}
	var nss []ns.Ref
	if spare == nil && outside != 0 {
		if nss, err = ns.Open(rec.Init.Pid, outside); err != nil {
			return freezeStart, nil, stream, err
		}
		defer ns.Close(nss)
	}
	root := m.sbRoot(rec.ID)
	ds, err := tool.Dump(ctx, criu.DumpOptions{
		Pid: rec.Init.Pid, ImagesDir: staging, WorkDir: work, LeaveRunning: true,
		TCPEstablished: true, FileLocks: true, NetworkLock: networkLock,
		FreezeCgroup: cg.FreezerDir(), CgroupMode: "ignore", Namespaces: nss, Spare: spare, LogLevel: m.criuLogLevel(),
		Stream: stream,
		PreDump: func() error {
			freezeStart = time.Now()
			capt.watch.arm("the freeze")
			if err := cg.Freeze(ctx); err != nil {
				return err
			}
			if outside&unix.CLONE_NEWIPC != 0 {
				if inUse, err := sysvIPCInUse(rec.Init.Pid); err != nil {
					return err
				} else if inUse {
					return errIPCAppeared
				}
			}
			if stream != nil {
				capt.watch.enter("the copy-on-write protection")
				if err := m.protect(ctx, cg, rec, stream, capt); err != nil {
					return err
				}
				stream.Hold(capt.mode == captureCOW)
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
			snapped = m.startSnapshot(root, id, m.groupsOf(rec), capt)
			capt.watch.enter("CRIU's dump")
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

// persist stores a captured full checkpoint (after the previous pending
// checkpoint of its sandbox, whose pages it may share) and commits it.
// On failure the checkpoint's directory goes, its children and the
// sandbox's head move to its parent, and the error is kept for whoever
// waits on it.
func (m *Manager) persist(ctx context.Context, t *sched.Task, job *pendingJob, rec sandboxRec, staging, work string, stream *criu.Stream, copied <-chan error, start time.Time) {
	var err error
	if copied != nil {
		if err = <-copied; err != nil {
			err = fmt.Errorf("dump the copies: %w", err)
		}
	}
	if stream != nil {
		// The pages it holds are copied now, off the frozen window (and
		// before waiting for the previous checkpoint: held pages keep the
		// processes' copies alive).
		if err = m.fail("full:stream"); err == nil {
			err = stream.WriteTo()
		}
		stream.Close()
		m.refillPipes()
	}
	job.waitPrevious()
	ck := m.pipe.ckOf(job) // reparent may have moved its parent meanwhile
	if err == nil {
		err = m.fail("persist:store")
	}
	if err == nil {
		err = m.persistImages(ctx, t, &ck, rec, staging, start)
	}
	// Gone before the waiters are released.
	removeStaging(staging)
	os.RemoveAll(work)
	if err != nil {
		err = m.exhausted(err)
		m.metrics.checkpoint.WithLabelValues(v1.KindFull, "failed").Inc()
		_ = m.cks.Delete(ck.ID)
		m.unlinkFailed(ck)
		// Listed as failed from here on, not dropped: it was reported.
		m.recordFailed(ck, err)
		m.turnForce(ck.Sandbox, fmt.Sprintf("checkpoint %s was captured but not committed", ck.ID))
		m.log.Warn("checkpoint not committed", "sandbox", ck.Sandbox, "checkpoint", ck.ID, "err", err)
	}
	if err == nil {
		m.crashpoint("persist:committed")
		// Before the waiters are released: one that waits for the
		// commit can then also wait for the standby.
		m.scheduleStandby(ck.Sandbox)
	}
	m.pipe.done(job, ck, err)
}

func (m *Manager) persistImages(ctx context.Context, t *sched.Task, ck *checkpointRec, rec sandboxRec, staging string, start time.Time) error {
	// Off the frozen window: move the images from staging into the pool,
	// writing only the pages no earlier checkpoint of this lineage holds.
	// Every MiB is accounted to the host's I/O budget, and a rollback
	// or a capture elsewhere pauses the copy there.
	yield := func(n int64) error { return charge(ctx, t, n) }
	objs, written, err := m.cks.Writer(ck.ID).StoreImages(ctx, staging, m.pageIndex(ck.Parent), yield)
	if err != nil {
		return err
	}
	m.crashpoint("persist:stored")
	ck.Objects = objs
	mb, err := m.writeManifest(*ck)
	if err != nil {
		return err
	}
	// One commit of the pool makes images, manifest and snapshot durable.
	// Not while another sandbox is frozen for a capture: a commit then
	// would lengthen its stall.
	if err := charge(ctx, t, 0); err != nil {
		return err
	}
	// Nor while a capture is under way on this host (commitgate.go).
	releaseCommits, err := m.commits.background(ctx)
	if err != nil {
		return err
	}
	defer releaseCommits()
	// The writable copy the first rollback to this checkpoint takes
	// (without it, that rollback snapshots the files itself).
	if err := fsnap.SnapshotIn(m.ckFS(ck.ID), m.ckFSNext(ck.ID), false, m.groupsOf(rec)...); err != nil {
		m.log.Debug("no writable copy of the checkpoint's files", "checkpoint", ck.ID, "err", err)
		_ = removeTree(m.ckFSNext(ck.ID))
	}
	if err := fsnap.SyncFS(m.ckDir(ck.ID)); err != nil {
		return err
	}
	releaseCommits()
	m.crashpoint("persist:synced")
	if err := m.fail("full:record"); err != nil {
		return err
	}
	ck.BytesWritten = written + int64(len(mb))
	ck.ImageBytes = ckstore.ImageBytes(objs)
	ck.DurationMS = ms(time.Since(start))
	if err := m.db.Put(store.Checkpoints, ck.ID, *ck); err != nil {
		return err
	}
	m.cks.Remember(ck.ID, objs)
	m.metrics.committed(ck.Checkpoint)
	return nil
}

// unlinkFailed takes a checkpoint that will never exist out of the tree:
// its children and its sandbox's head move to its parent.
func (m *Manager) unlinkFailed(ck checkpointRec) {
	unlock := m.lock(ck.Sandbox)
	defer unlock()
	if err := m.reparent(ck, false); err != nil {
		m.log.Warn("cannot take a failed checkpoint out of the tree", "checkpoint", ck.ID, "err", err)
	}
}

// stagingDir returns a fresh directory for CRIU to dump into: a tmpfs
// of its own holding at most bound bytes, mounted on a directory in the
// host's /dev/shm (a dump to memory, then only new pages reach the
// pool), else under fallback. Its own tmpfs, not the host's /dev/shm:
// a sandbox holding much memory cannot fill the host's /dev/shm, and a
// dump larger than the sandbox can be fails with ENOSPC (see
// stagingBound). Its name carries the root's tag, so a restarted daemon
// finds what a crashed one left.
func (m *Manager) stagingDir(fallback string, bound int64) (string, error) {
	var st unix.Statfs_t
	if unix.Statfs("/dev/shm", &st) == nil && st.Type == unix.TMPFS_MAGIC {
		if d, err := os.MkdirTemp("/dev/shm", m.stagingPrefix()); err == nil {
			err := unix.Mount("molt-staging", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
				fmt.Sprintf("size=%d,nr_inodes=65536,mode=0700", bound))
			if err == nil {
				return d, nil
			}
			os.Remove(d)
			m.log.Warn("cannot mount a tmpfs for dump staging; staging in the pool", "err", err)
		}
	}
	d := filepath.Join(fallback, "images")
	return d, os.Mkdir(d, 0o700)
}

// stagingBound is the most a dump of the sandbox rec may stage: what
// its memory limit lets it hold (or, without one, what it holds now),
// plus a quarter and 64 MiB for CRIU's own images. A dump never holds
// more than the tree's memory, so only a tree that grew past what was
// measured here meets the bound, and its checkpoint then fails with
// ENOSPC rather than taking the host's memory.
func stagingBound(rec sandboxRec) int64 {
	mem := rec.Resources.MemoryBytes
	if cg, err := cgroup.Load(cgroupName(rec.ID)); err == nil {
		if st, err := cg.Stats(); err == nil {
			mem = max(mem, st.MemoryBytes)
		}
	}
	return mem + mem/4 + 64<<20
}

// removeStaging unmounts and removes a staging directory.
func removeStaging(d string) {
	if strings.HasPrefix(d, "/dev/shm/") {
		// Detached: the tmpfs goes with the last file open in it.
		_ = unix.Unmount(d, unix.MNT_DETACH)
	}
	os.RemoveAll(d)
}

// stagingPrefix names this root's dump staging directories in /dev/shm.
func (m *Manager) stagingPrefix() string {
	sum := sha256.Sum256([]byte(m.cfg.Root))
	return "molt-dump-" + hex.EncodeToString(sum[:4]) + "-"
}

// pageIndex indexes the pages of the nearest full checkpoints up the
// lineage of a sandbox whose head is head, as their records find them
// (ckstore.Store.PageIndex).
func (m *Manager) pageIndex(head string) *pagestore.Index {
	return m.cks.PageIndex(head, func(id string) (ckstore.Ref, bool) {
		var c checkpointRec
		if err := m.db.Get(store.Checkpoints, id, &c); err != nil {
			return ckstore.Ref{}, false
		}
		return ckstore.Ref{ID: c.ID, Parent: c.Parent, Full: c.Kind == v1.KindFull, Objects: c.Objects}, true
	})
}

// verify checks every object the checkpoint's record lists (see
// ckstore.Reader.Verify). Nothing is restored from a checkpoint that
// fails; `molt checkpoint verify` is thorough.
func (m *Manager) verify(ck checkpointRec, thorough bool) error {
	return m.cks.Verify(ck.ID, ck.Objects, thorough)
}

// VerifyCheckpoint runs the verification a restore runs.
func (m *Manager) VerifyCheckpoint(ref string) (v1.Checkpoint, error) {
	if err := m.pipe.wait(context.Background(), ref, ""); err != nil {
		return v1.Checkpoint{}, err
	}
	ck, err := m.lookupCheckpoint(ref, "")
	if err != nil {
		return v1.Checkpoint{}, err
	}
	return ck.Checkpoint, m.verify(ck, true)
}

// processSource returns the checkpoint whose processes a rollback to ck
// restores: ck itself if it is full, else its nearest full ancestor.
func (m *Manager) processSource(ck checkpointRec) (checkpointRec, bool) {
	seen := map[string]bool{}
	for c := ck; ; {
		if c.Kind == v1.KindFull {
			return c, true
		}
		if c.Parent == "" || seen[c.Parent] {
			return checkpointRec{}, false
		}
		seen[c.ID] = true
		var p checkpointRec
		if err := m.db.Get(store.Checkpoints, c.Parent, &p); err != nil {
			return checkpointRec{}, false
		}
		c = p
	}
}

// rollbackProcesses moves the sandbox to the files of ck and the
// processes of procs (ck itself, or its full ancestor). The new tree is
// restored next to the live one, into a fresh writable snapshot; only
// once it runs is the old tree killed and the root switched. Any failure
// before that leaves the sandbox as it was.
func (m *Manager) rollbackProcesses(ctx context.Context, rec *sandboxRec, ck, procs checkpointRec) (v1.RollbackResult, error) {
	if err := m.verify(procs, false); err != nil {
		return v1.RollbackResult{}, err
	}
	next := filepath.Join(m.sbDir(rec.ID), "root.next")
	if err := removeTree(next); err != nil {
		return v1.RollbackResult{}, err
	}
	// The checkpoint's writable copy, if no rollback took it yet, else a
	// snapshot (a btrfs transaction commit), which goes ahead of
	// background commits (commitgate.go).
	if err := os.Rename(m.ckFSNext(ck.ID), next); err != nil {
		releaseCommits, err := m.commits.foreground(ctx)
		if err != nil {
			return v1.RollbackResult{}, err
		}
		err = fsnap.SnapshotIn(m.ckFS(ck.ID), next, false, m.groupsOf(*rec)...)
		releaseCommits()
		if err != nil {
			return v1.RollbackResult{}, err
		}
	}
	// Restored stopped: the turn inspector follows the new tree before
	// it runs, so nothing it does after the restore goes unseen.
	init, err := m.restoreTree(ctx, rec, procs, next, true, true, false)
	if err != nil {
		_ = removeTree(next)
		return v1.RollbackResult{}, err
	}
	key, err := m.recordTakeover(rec.ID, "rollback", hot.Record{Init: init, Path: next, Head: ck.ID})
	if err != nil {
		_ = init.Signal(unix.SIGKILL)
		waitGone(init, 5*time.Second)
		_ = removeTree(next)
		return v1.RollbackResult{}, err
	}
	if err := m.takeOver(rec, init, next); err != nil {
		m.forgetTakeover(key)
		return v1.RollbackResult{}, err
	}
	rec.Init, rec.State, rec.Reason, rec.Head = init, v1.StateRunning, "", ck.ID
	ts := m.turns.Prepare(rec.ID, init)
	if err := continueTree(*rec, init, m.ckImages(procs.ID)); err != nil {
		ts.Abandon()
		_ = init.Signal(unix.SIGKILL)
		return v1.RollbackResult{}, err
	}
	ts.BaselineAsync()
	if err := m.commitTakeover(*rec, key); err != nil {
		return v1.RollbackResult{}, err
	}
	res := v1.RollbackResult{Sandbox: rec.ID, Checkpoint: ck.ID, Tier: v1.TierWarm}
	if procs.ID != ck.ID {
		res.Note = fmt.Sprintf("fs checkpoint: files restored, with the processes of its full ancestor %s", procs.ID)
	}
	return res, nil
}

// takeOver makes the tree of init, running on root, the sandbox's: root
// trades places with the sandbox's root, then the old tree is killed
// (killing a PID namespace's init kills all of it) without waiting, and
// the old root is retired (deleted in the background once its tree is
// gone; see retire). On failure the new tree is killed and the old one
// runs on, on its own root.
//
// The caller has recorded the takeover (takeoverRec), so that a daemon
// that dies from the exchange on leaves a switch the next one completes.
func (m *Manager) takeOver(rec *sandboxRec, init sandbox.Init, root string) error {
	m.crashpoint("takeover:begin")
	retired, err := m.replaceRoot(rec.ID, root)
	if err != nil {
		_ = init.Signal(unix.SIGKILL)
		return fmt.Errorf("switch root: %w", err)
	}
	old := rec.Init
	_ = old.Signal(unix.SIGKILL)
	m.crashpoint("takeover:killed")
	if retired != "" {
		m.retire(rec.ID, retired, old)
	}
	return nil
}

// backgroundNice is the nice value of CRIU when it restores a standby:
// the restore (mostly the page faults of writing the tree's memory, 12-15
// µs each here) yields the CPU to the sandboxes and to the critical path
// of checkpoints and rollbacks, such as the next capture's frozen window.
// The restored tasks inherit it from CRIU and get their own dumped
// priority back as CRIU finishes.
const backgroundNice = 19

// setBackground gives the process pid (single-threaded: CRIU before it
// forks the tree) backgroundNice.
func setBackground(pid int) error {
	if err := unix.Setpriority(unix.PRIO_PROCESS, pid, backgroundNice); err != nil {
		return fmt.Errorf("lower the priority of %d: %w", pid, err)
	}
	return nil
}

// restoreProcesses restores the process tree of full checkpoint ck into
// the sandbox rec, on root (which holds the checkpoint's files). The
// restored tree joins the sandbox's cgroup and gets the sandbox's
// hostname (a fork's differs from the dumped one). On failure nothing of
// the new tree remains; processes already in the cgroup are untouched.
func (m *Manager) restoreProcesses(ctx context.Context, rec *sandboxRec, ck checkpointRec, root string) (sandbox.Init, error) {
	return m.restoreTree(ctx, rec, ck, root, false, false, false)
}

// restoreTree is restoreProcesses, optionally leaving every restored task
// stopped (a standby). With spare, the restore runs on the sandbox's
// spare CRIU if one is ready, and starts the next one afterwards: for a
// sandbox that restores again and again (rollbacks, standbys). With
// background, CRIU runs at the lowest priority (see backgroundNice).
func (m *Manager) restoreTree(ctx context.Context, rec *sandboxRec, ck checkpointRec, root string, stopped, spare, background bool) (sandbox.Init, error) {
	tool, err := m.criuReady(ctx)
	if err != nil {
		return sandbox.Init{}, err
	}
	cg, err := m.loadCgroup(*rec)
	if err != nil {
		return sandbox.Init{}, err
	}
	// The restored processes keep what they read, but the files say who
	// this sandbox is (a fork's differ from the dumped sandbox's).
	if err := m.withHeadroom(*rec, func() error { return sandbox.WriteIdentity(root, rec.Hostname, rec.MachineID) }); err != nil {
		return sandbox.Init{}, err
	}
	work := m.path("tmp", "restore-"+newID())
	if err := os.Mkdir(work, 0o700); err != nil {
		return sandbox.Init{}, err
	}
	defer os.RemoveAll(work)
	// A tree in a user namespace is restored onto its root mounted
	// idmapped to the images' block (userns.go).
	criuRoot, done, err := m.criuRoot(ck, root)
	if err != nil {
		return sandbox.Init{}, err
	}
	defer done()
	opts := criu.RestoreOptions{
		ImagesDir: m.ckImages(ck.ID), WorkDir: work, Root: criuRoot,
		RstSibling: true, LeaveStopped: stopped, TCPEstablished: true, FileLocks: true, NetworkLock: networkLock,
		// CRIU runs in the sandbox's cgroup and leaves cgroups alone:
		// the tree it forks lands there, whatever cgroups it was dumped
		// from (a fork's are another sandbox's).
		CgroupMode: "ignore", Started: cg.Add, LogLevel: m.criuLogLevel(),
	}
	// The tree inherits CRIU's cgroup namespace: the sandbox's (a spare
	// was started in it).
	var join []ns.Ref
	cgroupNS := func() error {
		cgns, err := m.cgroupNS(*rec, cg)
		if err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		if cgns.File != nil {
			join = []ns.Ref{cgns}
		}
		return nil
	}
	defer func() { ns.Close(join) }()
	if background {
		opts.Started = func(pid int) error {
			if err := cg.Add(pid); err != nil {
				return err
			}
			return setBackground(pid)
		}
	}
	if outside := ck.outside(); outside != 0 {
		// The tree joins CRIU's namespaces of these types: fresh ones,
		// named as the sandbox. A spare was started in fresh ones and
		// moved into the cgroup ahead of time.
		var s *criu.Spare
		if spare {
			s = m.takeSpare(rec.ID)
		}
		if s != nil && outside&unix.CLONE_NEWUTS != 0 {
			if err := s.SetHostname(rec.Hostname); err != nil {
				s.Kill()
				s = nil
			}
		}
		if s != nil && background {
			if err := setBackground(s.Pid()); err != nil {
				s.Kill()
				s = nil
			}
		}
		if s != nil {
			opts.Spare, opts.Started = s, nil
		} else {
			if err := cgroupNS(); err != nil {
				return sandbox.Init{}, err
			}
			nss, err := ns.Fresh(outside, rec.Hostname)
			if err != nil {
				return sandbox.Init{}, fmt.Errorf("restore: %w", err)
			}
			defer ns.Close(nss)
			opts.Namespaces = append(nss, join...)
		}
		if spare {
			defer m.refillSpare(rec.ID, cg)
		}
	} else {
		if err := cgroupNS(); err != nil {
			return sandbox.Init{}, err
		}
		opts.Namespaces = join
	}
	res, err := tool.Restore(ctx, opts)
	if err != nil {
		return sandbox.Init{}, fmt.Errorf("restore: %w", err)
	}
	init, err := sandbox.Adopt(res.Pid)
	if err == nil && ck.IDs.Enabled() && ck.outside()&unix.CLONE_NEWNET != 0 {
		err = lowPortsFor(init.Pid)
	}
	if err == nil && ck.outside()&unix.CLONE_NEWUTS == 0 {
		// The images carry the dumped UTS namespace (a fork's differs);
		// else the tree joined CRIU's, named above.
		err = sandbox.SetHostname(init.Pid, rec.Hostname)
	}
	if err == nil {
		err = m.fail("restore:adopted")
	}
	if err != nil {
		_ = unix.Kill(res.Pid, unix.SIGKILL)
		return sandbox.Init{}, fmt.Errorf("restore: %w", err)
	}
	rec.IDs = ck.IDs
	return init, nil
}
