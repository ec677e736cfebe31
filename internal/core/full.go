package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/capture"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/egress"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/hot"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/ns"
	"github.com/molt-sh/molt/internal/pagestore"
	"github.com/molt-sh/molt/internal/revert"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/sched"
	"golang.org/x/sys/unix"
)

// ckImages is the directory of checkpoint id's process images.

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
// of the sandbox at one instant (one freeze of its cgroup). The capture
// (internal/capture) dumps to a staging directory in memory; after the
// thaw it returns the checkpoint pending, and persist stores the images
// through the page store, writes the manifest and commits, in the
// background.
func (m *Manager) fullCheckpointLocked(ctx context.Context, rec sandboxRec, o ckOpts) (meta.Checkpoint, error) {
	label, keep := o.label, o.keep
	start := time.Now()
	tool, err := m.criuReady(ctx)
	if err != nil {
		return meta.Checkpoint{}, err
	}
	if m.report(rec).State != v1.StateRunning {
		return meta.Checkpoint{}, fmt.Errorf("a full checkpoint needs a running sandbox (it is %s; take an fs checkpoint): %w", m.report(rec).State, errdefs.ErrFailedPrecondition)
	}
	m.enforceLimits(&rec, "checkpoint")
	id := newID()
	r := revert.Logged(m.log, "full checkpoint of "+rec.ID)
	defer r.Fail()
	if _, err := m.cks.Create(id); err != nil {
		return meta.Checkpoint{}, err
	}
	r.Add(func() error { return m.cks.Delete(id) })
	// One instant for files and processes: freeze the cgroup (cgroup2,
	// about a millisecond), snapshot the root, let CRIU dump the frozen
	// tree (it freezes through the same cgroup, so it does not stop each
	// task with ptrace), thaw. Stall: freeze to thaw.
	cg, err := cgroup.Load(m.cgroupName(rec.ID))
	if err != nil {
		return meta.Checkpoint{}, err
	}
	// In a user namespace CRIU (host root, the namespace's owner) holds
	// every capability, CAP_SYS_RESOURCE included: any user dumps.
	if !rec.IDs.Enabled() {
		if err := capture.CheckDumpable(cg); err != nil {
			return meta.Checkpoint{}, err
		}
	}
	if err := m.quiet(rec.ID, time.Second); err != nil {
		return meta.Checkpoint{}, err
	}
	if why := capture.Traced(rec.Init.Pid); why != "" {
		return meta.Checkpoint{}, fmt.Errorf("%s: %w", why, errdefs.ErrFailedPrecondition)
	}
	// From the syncfs to the thaw no background commit of the pool
	// starts (commitgate.go).
	releaseCommits, err := m.commits.foreground(ctx)
	if err != nil {
		return meta.Checkpoint{}, err
	}
	defer releaseCommits()
	if err := fsnap.SyncFS(m.sbRoot(rec.ID)); err != nil {
		return meta.Checkpoint{}, err
	}
	// How to capture the tree (capture.Plan): the live tree only, the
	// standbys in the cgroup are not dumped.
	pids, _, perr := m.treePids(rec.ID, rec.Init)
	tree, err := capture.Inspect(rec.Init.Pid, pids, perr == nil, capture.Config{
		HoldFrozen: o.holdFrozen, NoCOW: m.opts.noCOWCapture, NoTemplate: m.opts.noTemplateCapture,
		NamespacesInImages: m.hooks.netnsInImages,
	})
	if err != nil {
		return meta.Checkpoint{}, err
	}
	if err := m.fail("full:namespaces"); err != nil {
		return meta.Checkpoint{}, err
	}
	// The ledger head before the freeze: an effect in flight across it
	// is one the restored tree may send again, answered from the ledger.
	ledgerHead := m.ledger.Head(rec.ID)
	c, err := m.runCapture(ctx, rec, cg, tool, id, tree, o)
	releaseCommits()
	if err != nil {
		return meta.Checkpoint{}, err
	}
	defer c.Close()
	if !o.holdFrozen {
		m.refillDumpSpare(rec, c.Outside)
	}
	ck := checkpointRec{Checkpoint: meta.Checkpoint{
		ID: id, Sandbox: rec.ID, Parent: rec.Head, Kind: v1.KindFull, Label: label,
		Created: time.Now().UTC(), StallMS: ms(c.Stall), Keep: keep,
		Capture: c.Mode, CaptureNote: c.Note,
		StallParts: (*meta.StallParts)(&c.Parts),
	}, Image: rec.Image, CRIU: tool.Probe(ctx).Version, ExternalNet: c.Outside&unix.CLONE_NEWNET != 0,
		ExternalUTS: c.Outside&unix.CLONE_NEWUTS != 0, ExternalIPC: c.Outside&unix.CLONE_NEWIPC != 0, IDs: rec.IDs,
		LedgerHead: ledgerHead, Turn: o.turn}
	if rec.Egress != nil {
		ck.EgressAddr = rec.Egress.Addr
	}
	// The consistent instant is captured and the sandbox runs on. The
	// rest (storing the images, the manifest, the commit) runs in the
	// background: the checkpoint is pending until committed. The sandbox
	// moves its head at once, so the next checkpoint is its child.
	rec.Head = id
	if err := m.db.Put(meta.Sandboxes, rec.ID, rec); err != nil {
		return meta.Checkpoint{}, err
	}
	job := m.pipe.add(ck)
	r.Success()
	// The copies are dumped into staging from now on; persist waits for
	// them, and owns the capture.
	m.startCopies(rec.ID, c)
	held := c.Hand()
	m.background(rec.ID, sched.Persist, "persist "+ck.ID, func(ctx context.Context, t *sched.Task) error {
		m.persist(ctx, t, job, rec, held, start)
		return job.err
	})
	ck.Pending = true
	ck.DurationMS = ms(time.Since(start))
	return ck.Checkpoint, nil
}

// runCapture captures the sandbox's tree as tree's plan says
// (capture.Run), into a fresh staging directory the result owns.
func (m *Manager) runCapture(ctx context.Context, rec sandboxRec, cg *cgroup.Cgroup, tool *criu.Tool, id string, tree capture.Tree, o ckOpts) (*capture.Captured, error) {
	work := m.path("tmp", "dump-"+id)
	if err := os.Mkdir(work, 0o700); err != nil {
		return nil, err
	}
	staging, err := m.stagingDir(work, m.stagingBound(rec))
	if err == nil && m.encrypting() && !strings.HasPrefix(staging, "/dev/shm/") {
		// Images are sealed on their way to the pool: a dump staged on
		// disk would put them there in plaintext.
		err = fmt.Errorf("encryption at rest needs dumps staged in memory (a tmpfs at /dev/shm): %w", errdefs.ErrNotSupported)
	}
	if err != nil {
		os.RemoveAll(work)
		return nil, err
	}
	root := m.sbRoot(rec.ID)
	return capture.Run(ctx, capture.Target{
		Pid: rec.Init.Pid, Cgroup: cg, Tool: tool, Strategy: capture.Plan(tree),
		Staging: staging, Work: work,
		Release:  func() { removeStaging(staging); os.RemoveAll(work) },
		Deadline: m.frozenDeadline(tree.AnonBytes),
		Pids: func() ([]int, error) {
			pids, _, err := m.treePids(rec.ID, rec.Init)
			return pids, err
		},
		Snapshot: func() error { return snapshotRoot(root, m.ckFS(id), m.groupsOf(rec)) },
		Pipes:    m.pipePool,
		Spare:    func(outside int) *criu.Spare { return m.takeDumpSpare(rec, outside) },
		ReserveCopies: func() (func(), error) {
			// The copies are not the sandbox's (limits.go).
			key := copiesRoom(id)
			if err := m.reserveRoom(rec, key, room{mem: tree.AnonBytes, pids: int64(tree.Procs)}); err != nil {
				return nil, err
			}
			return func() { m.releaseRoom(rec.ID, key) }, nil
		},
		HoldFrozen: o.holdFrozen, Frozen: o.frozen, LogLevel: m.criuLogLevel(),
		Fail: m.fail, Crash: m.crashpoint,
	})
}

// persist stores a captured full checkpoint (after the previous pending
// checkpoint of its sandbox, whose pages it may share) and commits it.
// On failure the checkpoint's directory goes, its children and the
// sandbox's head move to its parent, and the error is kept for whoever
// waits on it.
func (m *Manager) persist(ctx context.Context, t *sched.Task, job *pendingJob, rec sandboxRec, c *capture.Captured, start time.Time) {
	// The copies' dumps, or the pages the stream holds, written out now,
	// off the frozen window (and before waiting for the previous
	// checkpoint: held pages keep the processes' copies alive).
	err := c.Finish()
	if c.Streamed() {
		m.refillPipes()
	}
	job.waitPrevious()
	ck := m.pipe.ckOf(job) // reparent may have moved its parent meanwhile
	if err == nil {
		err = m.fail("persist:store")
	}
	if err == nil {
		err = m.persistImages(ctx, t, &ck, rec, c.Staging(), start)
	}
	// Gone before the waiters are released.
	c.Close()
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
		m.scheduleUpload(ck.Sandbox, ck.ID)
	}
	m.pipe.done(job, ck, err)
}

func (m *Manager) persistImages(ctx context.Context, t *sched.Task, ck *checkpointRec, rec sandboxRec, staging string, start time.Time) error {
	// Off the frozen window: move the images from staging into the pool,
	// writing only the pages no earlier checkpoint of this lineage holds.
	// Every MiB is accounted to the host's I/O budget, and a rollback
	// or a capture elsewhere pauses the copy there.
	j := m.pipe.job(ck.ID)
	yield := func(n int64) error {
		if j != nil {
			j.written.Add(n)
		}
		return charge(ctx, t, n)
	}
	k, err := m.dataKeyOf(rec)
	if err != nil {
		return err
	}
	objs, written, err := m.cks.Writer(ck.ID).StoreImages(ctx, staging, m.pageIndex(ck.Parent), yield, k)
	if err != nil {
		return err
	}
	if k != nil {
		ck.DataKey, ck.KeyTenant = k.ID, k.Tenant
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
	if err := m.db.Put(meta.Checkpoints, ck.ID, *ck); err != nil {
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
func (m *Manager) stagingBound(rec sandboxRec) int64 {
	mem := rec.Resources.MemoryBytes
	if cg, err := cgroup.Load(m.cgroupName(rec.ID)); err == nil {
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
		// An offloaded checkpoint's local files, if any, are a fetch
		// under way: no page is shared from them.
		if err := m.db.Get(meta.Checkpoints, id, &c); err != nil || c.Offloaded {
			return ckstore.Ref{}, false
		}
		return ckstore.Ref{ID: c.ID, Parent: c.Parent, Full: c.Kind == v1.KindFull, Objects: c.Objects}, true
	})
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
		if err := m.db.Get(meta.Checkpoints, c.Parent, &p); err != nil {
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
func (m *Manager) rollbackProcesses(ctx context.Context, rec *sandboxRec, ck, procs checkpointRec) (meta.RollbackResult, error) {
	// A lazy resume's pages are checked as they come (lazy.go).
	if lazyFrom(ctx, procs.ID) == nil {
		if err := m.verify(procs, false); err != nil {
			return meta.RollbackResult{}, err
		}
	}
	next := filepath.Join(m.sbDir(rec.ID), "root.next")
	if err := removeTree(next); err != nil {
		return meta.RollbackResult{}, err
	}
	// The checkpoint's writable copy, if no rollback took it yet, else a
	// snapshot (a btrfs transaction commit), which goes ahead of
	// background commits (commitgate.go).
	if err := os.Rename(m.ckFSNext(ck.ID), next); err != nil {
		releaseCommits, err := m.commits.foreground(ctx)
		if err != nil {
			return meta.RollbackResult{}, err
		}
		err = fsnap.SnapshotIn(m.ckFS(ck.ID), next, false, m.groupsOf(*rec)...)
		releaseCommits()
		if err != nil {
			return meta.RollbackResult{}, err
		}
	}
	// Restored stopped: the turn inspector follows the new tree before
	// it runs, so nothing it does after the restore goes unseen.
	init, err := m.restoreTree(ctx, rec, procs, next, true, true, false)
	if err != nil {
		_ = removeTree(next)
		return meta.RollbackResult{}, err
	}
	key, err := m.recordTakeover(rec.ID, "rollback", hot.Record{Init: init, Path: next, Head: ck.ID})
	if err != nil {
		_ = init.Signal(unix.SIGKILL)
		waitGone(init, 5*time.Second)
		_ = removeTree(next)
		return meta.RollbackResult{}, err
	}
	if err := m.takeOver(rec, init, next); err != nil {
		m.forgetTakeover(key)
		return meta.RollbackResult{}, err
	}
	rec.Init, rec.State, rec.Reason, rec.Head = init, v1.StateRunning, "", ck.ID
	if err := m.netActivate(*rec, init); err != nil {
		m.log.Warn("egress: the restored sandbox has no network", "sandbox", rec.ID, "err", err)
	}
	ts := m.turns.Prepare(rec.ID, init)
	if err := m.continueTree(*rec, init, m.ckImages(procs.ID)); err != nil {
		ts.Abandon()
		_ = init.Signal(unix.SIGKILL)
		return meta.RollbackResult{}, err
	}
	ts.BaselineAsync()
	if err := m.commitTakeover(*rec, key); err != nil {
		return meta.RollbackResult{}, err
	}
	res := meta.RollbackResult{Sandbox: rec.ID, Checkpoint: ck.ID, Tier: v1.TierWarm}
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
	lf := lazyFrom(ctx, ck.ID)
	if lf == nil {
		// A checkpoint being fetched lazily for a resume is whole once
		// that fetch is done (it holds the fetch lock until then).
		if err := m.ensureLocal(ctx, &ck); err != nil {
			return sandbox.Init{}, err
		}
	} else {
		spare = false
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
	images, closeImages, err := m.openImages(ck)
	if err != nil {
		return sandbox.Init{}, err
	}
	defer closeImages()
	// CRIU, root on the host, acts on what the images say: every
	// restore checks them, whoever signed them (about 1 ms for a small
	// tree's images: pages images are only sized), on the very files
	// CRIU is given (docs/security.md, "Hostile checkpoint input").
	if err := checkImages(ck, images); err != nil {
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
		ImagesDir: images, WorkDir: work, Root: criuRoot,
		RstSibling: true, LeaveStopped: stopped, TCPEstablished: true, FileLocks: true, NetworkLock: networkLock,
		// CRIU runs in the sandbox's cgroup and leaves cgroups alone:
		// the tree it forks lands there, whatever cgroups it was dumped
		// from (a fork's are another sandbox's).
		CgroupMode: "ignore", Started: cg.Add, LogLevel: m.criuLogLevel(),
	}
	if background {
		opts.Started = func(pid int) error {
			if err := cg.Add(pid); err != nil {
				return err
			}
			return setBackground(pid)
		}
	}
	release, err := m.restoreNamespaces(*rec, cg, ck, &opts, spare, background)
	defer release()
	if err != nil {
		return sandbox.Init{}, err
	}
	if lf != nil {
		opts.LazyPages, opts.PageServer = true, lf.theirs
		if err := lf.guardWith(m.cgroupName(rec.ID)); err != nil {
			return sandbox.Init{}, err
		}
	}
	res, err := tool.Restore(ctx, opts)
	if lf != nil {
		lf.theirs.Close() // the daemon has its own
	}
	if err != nil {
		return sandbox.Init{}, fmt.Errorf("restore: %w", err)
	}
	init, err := sandbox.Adopt(res.Pid)
	if err == nil && lf != nil {
		// From here the tree is the fetch's to kill if a page fails.
		err = lf.started(init)
	}
	if err == nil && rec.Network == v1.NetworkEgress {
		// Before the tree runs (it was restored stopped, or is a fork
		// that has run for microseconds at most).
		bound := rec.Egress != nil && egress.BindOnly(ck.EgressAddr, rec.Egress.Addr)
		if rerr := egress.ResetWorld(init.Pid, bound); rerr != nil {
			m.log.Warn("egress: cannot reset the restored tree's connections to the world", "sandbox", rec.ID, "err", rerr)
		}
	}
	if err == nil && ck.IDs.Enabled() && ck.Outside()&unix.CLONE_NEWNET != 0 {
		err = lowPortsFor(init.Pid)
	}
	if err == nil && ck.Outside()&unix.CLONE_NEWUTS == 0 {
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

// restoreNamespaces sets the namespaces the restored tree joins in opts:
// the sandbox's cgroup namespace, and fresh ones of the types the images
// leave out (named as the sandbox), or the sandbox's spare CRIU, started
// in such namespaces ahead of time, when spare is set and one is ready.
// release, always to be called once the restore is over, closes them and
// starts the next spare.
func (m *Manager) restoreNamespaces(rec sandboxRec, cg *cgroup.Cgroup, ck checkpointRec, opts *criu.RestoreOptions, spare, background bool) (release func(), err error) {
	var cleanups []func()
	release = func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	// The tree inherits CRIU's cgroup namespace: the sandbox's (a spare
	// was started in it).
	var join []ns.Ref
	cgroupNS := func() error {
		cgns, err := m.cgroupNS(rec, cg)
		if err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		if cgns.File != nil {
			join = []ns.Ref{cgns}
		}
		return nil
	}
	cleanups = append(cleanups, func() { ns.Close(join) })
	outside := ck.Outside()
	if outside == 0 {
		if err := cgroupNS(); err != nil {
			return release, err
		}
		opts.Namespaces = join
		return release, nil
	}
	// The tree joins CRIU's namespaces of these types: fresh ones, named
	// as the sandbox. A spare was started in fresh ones and moved into
	// the cgroup ahead of time.
	refill := func() {
		if spare { // the next restore's spare, once this one is done
			cleanups = append(cleanups, func() { m.refillSpare(rec.ID, cg) })
		}
	}
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
	if s != nil && outside&unix.CLONE_NEWNET != 0 {
		if err := m.prepareSpareNet(rec, ck, s.Pid()); err != nil {
			m.log.Info("egress: spare not used", "sandbox", rec.ID, "err", err)
			s.Kill()
			s = nil
		}
	}
	if s != nil {
		opts.Spare, opts.Started = s, nil
		refill()
		return release, nil
	}
	if err := cgroupNS(); err != nil {
		return release, err
	}
	nss, err := ns.Fresh(outside, rec.Hostname)
	if err != nil {
		return release, fmt.Errorf("restore: %w", err)
	}
	cleanups = append(cleanups, func() { ns.Close(nss) })
	for _, r := range nss {
		if r.Type == unix.CLONE_NEWNET {
			if err := m.netPrepare(rec, ck, r.File); err != nil {
				return release, fmt.Errorf("restore: %w", err)
			}
		}
	}
	opts.Namespaces = append(nss, join...)
	refill()
	return release, nil
}
