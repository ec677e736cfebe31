package core

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/revert"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/sbinit"
	"github.com/molt-sh/molt/internal/seccomp"
	"github.com/molt-sh/molt/internal/turn"
	"golang.org/x/sys/unix"
)

// sandboxRec is a sandbox's metadata record (meta.SandboxRecord). State
// is the state molt last put it in; the reported state also checks that
// init still runs.
type sandboxRec = meta.SandboxRecord

// cgroupName is the cgroup of sandbox id, under Config.CgroupParent.
func (m *Manager) cgroupName(id string) string { return m.cgroupParent() + "/" + id }

// cgroupParent is the cgroup of the sandboxes: Config.CgroupParent, "molt" by default.
func (m *Manager) cgroupParent() string {
	if m.cfg.CgroupParent != "" {
		return m.cfg.CgroupParent
	}
	return "molt"
}

func (m *Manager) sbDir(id string) string  { return m.path("sandboxes", id) }
func (m *Manager) sbRoot(id string) string { return m.path("sandboxes", id, "root") }

func newMachineID() string { return newID() + newID() + newID()[:8] }

// Create makes a sandbox from an image and starts it.
func (m *Manager) Create(ctx context.Context, req v1.SandboxCreateRequest) (meta.Sandbox, error) {
	img, err := m.Image(req.Image)
	if err != nil {
		return meta.Sandbox{}, err
	}
	if b := req.Resources.StandbyBudgetBytes; b < -1 {
		return meta.Sandbox{}, fmt.Errorf("standby budget %d: want bytes, 0 for the daemon's default or -1 for none: %w", b, errdefs.ErrInvalidArgument)
	}
	if err := req.Resources.Validate(); err != nil {
		return meta.Sandbox{}, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	disk, err := m.diskQuota(req.Resources.DiskBytes)
	if err != nil {
		return meta.Sandbox{}, err
	}
	req.Resources.DiskBytes = disk
	rec := sandboxRec{Sandbox: meta.Sandbox{
		ID: newID(), Name: req.Name, Tenant: req.Tenant, Image: req.Image, Hostname: req.Hostname,
		Env: imageEnv(img.Config, req.Env), Resources: m.resolveResources(meta.Resources(req.Resources)), Seccomp: req.Seccomp,
	}, MachineID: newMachineID(), SeccompProfile: req.SeccompProfile, RecordLimit: req.RecordLimit,
		ImageConfig: cloneImageConfig(img.Config)}
	if req.Tenant != "" {
		var t meta.TenantRecord
		if err := m.db.Get(meta.Tenants, req.Tenant, &t); err != nil {
			return meta.Sandbox{}, fmt.Errorf("tenant %q: no such tenant (molt tenant create): %w", req.Tenant, errdefs.ErrInvalidArgument)
		}
	}
	if req.RecordLimit < 0 {
		return meta.Sandbox{}, fmt.Errorf("record limit %d: want bytes, or 0 for the daemon's: %w", req.RecordLimit, errdefs.ErrInvalidArgument)
	}
	if rec.Seccomp == "" && rec.SeccompProfile != "" {
		rec.Seccomp = v1.SeccompCustom
	}
	if rec.Seccomp == "" {
		rec.Seccomp = m.seccompDefault()
	}
	if _, err := m.seccompProgram(&rec); err != nil {
		return meta.Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	if err := setNetwork(&rec, req); err != nil {
		return meta.Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	if err := m.sealSecrets(&rec, req.Secrets); err != nil {
		return meta.Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	m.noteTenant(rec.ID, rec.Tenant)
	sb, err := m.createFrom(ctx, rec, m.imageDir(req.Image), nil, nil)
	if err != nil {
		return meta.Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	return sb, nil
}

// createFrom makes the sandbox described by rec (see makeSandbox) and
// records it. On failure nothing is left behind (a standby is killed).
func (m *Manager) createFrom(ctx context.Context, rec sandboxRec, src string, procs *checkpointRec, sby *standby) (meta.Sandbox, error) {
	if rec.Name != "" {
		if err := validName("sandbox", rec.Name); err != nil {
			return meta.Sandbox{}, err
		}
	}
	// Name uniqueness is checked and claimed under m.mu via the record
	// lock of the name.
	if rec.Name != "" {
		unlock := m.lock("name/" + rec.Name)
		defer unlock()
		if _, err := m.lookupSandbox(rec.Name); err == nil {
			return meta.Sandbox{}, fmt.Errorf("sandbox name %q: %w", rec.Name, errdefs.ErrAlreadyExists)
		}
	}
	rec, r, err := m.makeSandbox(ctx, rec, src, procs, sby)
	if err != nil {
		return meta.Sandbox{}, err
	}
	defer r.Fail()
	if err := m.db.Put(meta.Sandboxes, rec.ID, rec); err != nil {
		return meta.Sandbox{}, err
	}
	r.Success()
	m.turnReset(ctx, rec)
	return m.report(rec), nil
}

// makeSandbox makes the sandbox described by rec with a writable
// snapshot of src as its root and starts it (a fresh init, or the
// processes of the full checkpoint procs), but does not record it: the
// caller writes the returned record, then calls Success on the returned
// Reverter, or Fail, which removes all of it. Until then the sandbox is
// an unlisted directory and cgroup, which start-up removes should the
// daemon die. With sby, a standby of procs (taken out of its sandbox's
// pool) becomes the new sandbox instead: its root and stopped tree are
// adopted, no CRIU restore runs. On failure nothing is left behind (a
// standby is killed).
func (m *Manager) makeSandbox(ctx context.Context, rec sandboxRec, src string, procs *checkpointRec, sby *standby) (sandboxRec, *revert.Reverter, error) {
	if rec.Hostname == "" {
		rec.Hostname = rec.Name
		if rec.Hostname == "" {
			rec.Hostname = "molt-" + rec.ID
		}
	}
	if err := validHostname(rec.Hostname); err != nil {
		return rec, nil, err
	}
	unlock := m.lock(rec.ID)
	defer unlock()

	r := revert.Logged(m.log, "make sandbox "+rec.ID)
	dir := m.sbDir(rec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return rec, nil, err
	}
	fail := func(err error) (sandboxRec, *revert.Reverter, error) {
		r.Fail()
		return rec, nil, err
	}
	groups, undoQgroup, err := m.makeQgroup(&rec)
	if err != nil {
		return fail(err)
	}
	r.Add(undoQgroup)
	r.Add(func() error { return removeTree(dir) })
	switch {
	case procs != nil:
		// The images' user namespace maps the block they were dumped
		// with: a fork from them shares it.
		rec.IDs = procs.IDs
	case m.cfg.UserNS && !rec.IDs.Enabled():
		ids, release, err := m.allocIDs(rec.ID)
		if err != nil {
			return fail(err)
		}
		r.Add(func() error { release(); return nil })
		rec.IDs = ids
	}
	if sby != nil {
		r.Add(func() error { m.discard(sby, true); return nil })
		if err := os.Rename(sby.Root, m.sbRoot(rec.ID)); err != nil {
			return fail(err)
		}
		// The standby is the fork's now, never its sandbox's.
		m.forgetTakeover(sby.Key)
		sby.Key = ""
		if err := m.regroup(m.sbRoot(rec.ID), sby.Sandbox, groups); err != nil {
			return fail(err)
		}
	} else if err := fsnap.SnapshotIn(src, m.sbRoot(rec.ID), false, groups...); err != nil {
		return fail(err)
	}
	if err := m.fail("create:snapshot"); err != nil {
		return fail(err)
	}
	cg, err := cgroup.New(m.cgroupName(rec.ID), cgResources(rec.Resources))
	if err != nil {
		return fail(err)
	}
	r.Add(func() error { return cg.Destroy(context.Background()) })
	if err := m.fail("create:cgroup"); err != nil {
		return fail(err)
	}
	leave, err := m.netJoin(&rec)
	if err != nil {
		return fail(err)
	}
	r.Add(leave)
	if rec.ForkedFrom != "" {
		// A fork's ledger starts as its sandbox's at the checkpoint (the
		// same history, a branch of its own), before its processes run
		// and record anything.
		drop, err := m.ledgerFork(rec)
		if err != nil {
			return fail(err)
		}
		r.Add(drop)
	}
	var init sandbox.Init
	if sby != nil {
		init, err = m.adoptStandby(&rec, sby, cg)
	} else if procs != nil {
		init, err = m.restoreProcesses(ctx, &rec, *procs, m.sbRoot(rec.ID))
	} else {
		init, err = m.startInit(ctx, &rec, cg)
	}
	if err != nil {
		return fail(err)
	}
	r.Add(func() error { sandbox.Forget(init); return nil })
	if err := m.netActivate(rec, init); err != nil {
		_ = init.Signal(unix.SIGKILL)
		return fail(err)
	}
	if err := m.fail("create:started"); err != nil {
		return fail(err)
	}
	rec.Init = init
	rec.State = v1.StateRunning
	rec.Reason = ""
	rec.Created = time.Now().UTC()
	return rec, r, nil
}

func validHostname(h string) error {
	if len(h) == 0 || len(h) > 63 || strings.Trim(h, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.") != "" {
		return fmt.Errorf("hostname %q: want 1-63 letters, digits, '-' or '.': %w", h, errdefs.ErrInvalidArgument)
	}
	return nil
}

// startInit installs the current init binary into the sandbox root and
// starts init in cg.
func (m *Manager) startInit(ctx context.Context, rec *sandboxRec, cg *cgroup.Cgroup) (sandbox.Init, error) {
	root := m.sbRoot(rec.ID)
	// The init binary, then stage 1's device nodes and mount points
	// (withHeadroom: a sandbox at its quota still restarts).
	prog, err := m.seccompProgram(rec)
	if err != nil {
		return sandbox.Init{}, err
	}
	env, err := m.initEnv(*rec)
	if err != nil {
		return sandbox.Init{}, err
	}
	var init sandbox.Init
	err = m.withHeadroom(*rec, func() error {
		if err := sandbox.InstallInit(root, m.initBin); err != nil {
			return err
		}
		if rec.IDs.Enabled() {
			// Stage 1 cannot make device nodes in a user namespace.
			if err := sandbox.MakeDevNodes(root); err != nil {
				return err
			}
		}
		var err error
		init, err = m.launcher.StartIn(ctx, root, sbinit.Config{
			Hostname: rec.Hostname, MachineID: rec.MachineID, Env: env,
			Seccomp: prog.Bytes(),
		}, cg.Add, rec.IDs)
		return err
	})
	return init, err
}

// seccompDefault is the filter of sandboxes created without a choice.
func (m *Manager) seccompDefault() string {
	if m.cfg.SeccompDefault == "" {
		return v1.SeccompDefault
	}
	return m.cfg.SeccompDefault
}

// seccompProgram compiles the filter of rec's processes (nil: none). A
// record from before filters existed gets the daemon's default.
func (m *Manager) seccompProgram(rec *sandboxRec) (seccomp.Program, error) {
	mode := rec.Seccomp
	if mode == "" {
		mode = m.seccompDefault()
	}
	prog, err := seccomp.ForMode(mode, []byte(rec.SeccompProfile), seccomp.ParseOptions{Caps: sbinit.DefaultCapNames, Kernel: m.kernel})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return prog, nil
}

// lookupSandbox finds a sandbox by ID, name or unique ID prefix.
func (m *Manager) lookupSandbox(ref string) (sandboxRec, error) {
	var rec sandboxRec
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return rec, fmt.Errorf("empty sandbox reference: %w", errdefs.ErrInvalidArgument)
	}
	if err := m.db.Get(meta.Sandboxes, ref, &rec); err == nil {
		return rec, nil
	}
	named, err := sandboxRecs.ListBy(m.db, m.ix.sbByName, ref)
	if err != nil {
		return rec, err
	}
	if len(named) > 0 {
		return named[0], nil
	}
	var matches []sandboxRec
	if isPrefixRef(ref) {
		if matches, err = byIDPrefix(m.db, sandboxRecs, ref); err != nil {
			return rec, err
		}
	}
	switch len(matches) {
	case 0:
		return rec, notFound("sandbox", ref)
	case 1:
		return matches[0], nil
	}
	return rec, fmt.Errorf("sandbox %q is ambiguous (%d matches): %w", ref, len(matches), errdefs.ErrInvalidArgument)
}

// lockSandbox finds a sandbox, takes its lock and reads its record again
// under the lock: another operation may have changed it (moved its head,
// replaced its init) while this one waited.
func (m *Manager) lockSandbox(ref string) (sandboxRec, func(), error) {
	rec, err := m.lookupSandbox(ref)
	if err != nil {
		return rec, nil, err
	}
	unlock := m.lock(rec.ID)
	// A template capture's copies are processes of the sandbox until
	// they are dumped: whatever changes the sandbox (kills its tree,
	// captures it again) waits for that, a few hundred milliseconds at
	// most after the capture.
	m.waitCopies(rec.ID)
	if err := m.db.Get(meta.Sandboxes, rec.ID, &rec); err != nil {
		unlock()
		return rec, nil, notFound("sandbox", ref)
	}
	return rec, unlock, nil
}

// report turns a record into what the API shows, checking that a
// running sandbox's init is still there.
func (m *Manager) report(rec sandboxRec) meta.Sandbox {
	sb := rec.Sandbox
	if sb.State == v1.StateRunning {
		if rec.Init.Alive() {
			sb.Pid = rec.Init.Pid
		} else {
			sb.State = v1.StateLost
			sb.Reason = fmt.Sprintf("init (pid %d) is gone: the host restarted or the process was killed; start or remove the sandbox", rec.Init.Pid)
		}
	}
	return sb
}

// Sandbox returns one sandbox, with live details (sessions, memory).
func (m *Manager) Sandbox(ctx context.Context, ref string) (meta.Sandbox, error) {
	rec, err := m.lookupSandbox(ref)
	if err != nil {
		return meta.Sandbox{}, err
	}
	sb := m.report(rec)
	if s := m.standbyOf(rec.ID); s != nil {
		sb.Standby = s.Checkpoint
	}
	sb.Standbys, sb.StandbyBytes = m.standbyCheckpoints(rec.ID), m.standbyBytes(rec.ID)
	if n := m.diskUsage(rec); n >= 0 {
		sb.DiskUsedBytes = n
	}
	if sb.State == v1.StateRunning {
		if cg, err := cgroup.Load(m.cgroupName(rec.ID)); err == nil {
			if st, err := cg.Stats(); err == nil {
				sb.MemoryBytes, sb.Processes = st.MemoryBytes, st.Pids
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if resp, err := m.call(cctx, rec, sbinit.Request{Op: "status"}); err == nil {
			for _, s := range resp.Sessions {
				sb.Sessions = append(sb.Sessions, meta.Session{Name: s.Name, Pid: s.Pid, Alive: true})
			}
		}
	}
	return sb, nil
}

// Sandboxes lists all sandboxes, oldest first.
func (m *Manager) Sandboxes() ([]meta.Sandbox, error) {
	recs, err := meta.List[sandboxRec](m.db, meta.Sandboxes)
	if err != nil {
		return nil, err
	}
	out := make([]meta.Sandbox, 0, len(recs))
	for _, r := range recs {
		out = append(out, m.report(r))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// loadCgroup opens the sandbox's cgroup, creating it again if it is gone
// (after a host reboot).
func (m *Manager) loadCgroup(rec sandboxRec) (*cgroup.Cgroup, error) {
	cg, err := cgroup.Load(m.cgroupName(rec.ID))
	if errors.Is(err, errdefs.ErrNotFound) {
		return cgroup.New(m.cgroupName(rec.ID), cgResources(rec.Resources))
	}
	return cg, err
}

// Stop kills every process of the sandbox. Its files stay.
func (m *Manager) Stop(ctx context.Context, ref string) (meta.Sandbox, error) {
	rec, unlock, err := m.lockSandbox(ref)
	if err != nil {
		return meta.Sandbox{}, err
	}
	defer unlock()
	next, err := m.stopTree(ctx, rec, v1.StateStopped, "")
	if err != nil {
		return meta.Sandbox{}, fmt.Errorf("stop %s: %w", rec.ID, err)
	}
	return m.report(next), nil
}

// stopTree kills the sandbox's processes and leaves it in state
// (stopped or hibernated) with reason, and returns its new record. The
// record goes first: a daemon that dies before the processes are gone
// leaves a sandbox in its new state, whose processes start-up kills
// (reconcile), rather than a lost one that Resume refuses. If the kill
// fails, the old record is put back.
func (m *Manager) stopTree(ctx context.Context, rec sandboxRec, state, reason string) (sandboxRec, error) {
	next := rec
	next.State, next.Reason, next.Init = state, reason, sandbox.Init{}
	if err := m.db.Put(meta.Sandboxes, rec.ID, next); err != nil {
		return rec, err
	}
	m.crashpoint("stop:recorded")
	err := m.fail("stop:kill")
	if err == nil {
		err = m.killProcesses(ctx, rec)
	}
	if err != nil {
		if perr := m.db.Put(meta.Sandboxes, rec.ID, rec); perr != nil {
			err = errors.Join(err, perr)
		}
		return rec, err
	}
	m.turnForget(rec.ID)
	return next, nil
}

// killProcesses kills every process of the sandbox, its standbys and
// spare CRIU too, and deletes the roots its rollbacks retired.
func (m *Manager) killProcesses(ctx context.Context, rec sandboxRec) error {
	m.dropSpare(rec.ID)
	cg, err := cgroup.Load(m.cgroupName(rec.ID))
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		err = nil
	case err == nil:
		err = cg.Kill(ctx)
	default:
		return err
	}
	m.dropStandby(rec.ID, false)
	m.removeRetired(rec.ID)
	sandbox.Forget(rec.Init)
	return err
}

// Start starts a stopped or lost sandbox's init (a fresh process tree on
// its current files).
func (m *Manager) Start(ctx context.Context, ref string) (meta.Sandbox, error) {
	rec, unlock, err := m.lockSandbox(ref)
	if err != nil {
		return meta.Sandbox{}, err
	}
	defer unlock()
	if rec.State == v1.StateRunning && rec.Init.Alive() {
		return m.report(rec), nil
	}
	if rec.State == v1.StateHibernated {
		return meta.Sandbox{}, fmt.Errorf("start %s: the sandbox is hibernated; resume it (start would discard its processes): %w", rec.ID, errdefs.ErrFailedPrecondition)
	}
	if err := m.restart(ctx, &rec); err != nil {
		return meta.Sandbox{}, fmt.Errorf("start %s: %w", rec.ID, err)
	}
	return m.report(rec), nil
}

// restart kills whatever runs in the sandbox and starts a fresh init,
// recording the result. Caller holds the sandbox lock.
func (m *Manager) restart(ctx context.Context, rec *sandboxRec) error {
	if !rec.Restarting {
		rec.Restarting = true
		if err := m.db.Put(meta.Sandboxes, rec.ID, *rec); err != nil {
			rec.Restarting = false
			return err
		}
	}
	if err := m.killProcesses(ctx, *rec); err != nil {
		rec.Restarting = false
		_ = m.db.Put(meta.Sandboxes, rec.ID, *rec)
		return err
	}
	m.crashpoint("restart:killed")
	rec.Restarting = false
	cg, err := m.loadCgroup(*rec)
	if err == nil {
		var init sandbox.Init
		if init, err = m.startInit(ctx, rec, cg); err == nil {
			if err = m.netActivate(*rec, init); err != nil {
				_ = init.Signal(unix.SIGKILL)
			} else {
				rec.State, rec.Reason, rec.Init = v1.StateRunning, "", init
			}
		}
	}
	if err != nil {
		rec.State, rec.Reason, rec.Init = v1.StateStopped, "start failed: "+err.Error(), sandbox.Init{}
		_ = m.db.Put(meta.Sandboxes, rec.ID, *rec)
		return err
	}
	if err := m.db.Put(meta.Sandboxes, rec.ID, *rec); err != nil {
		return err
	}
	m.turnReset(ctx, *rec)
	return nil
}

// Remove deletes a sandbox: its processes, cgroup, root and checkpoints.
func (m *Manager) Remove(ctx context.Context, ref string) error {
	if r, err := m.lookupSandbox(ref); err == nil {
		if err := m.pipe.wait(ctx, "", r.ID); err != nil {
			return err
		}
	}
	rec, unlock, err := m.lockSandbox(ref)
	if err != nil {
		return err
	}
	defer unlock()
	return m.removeHere(ctx, rec, false)
}

// removeHere removes sandbox rec from this daemon: its processes, its
// records, its local checkpoints and its root; what is in the object
// store stays. keepHistory keeps its ledger and turn log (a sandbox
// that migrated: they do not move with it yet).
//
// Preconditions: rec's lock is held.
func (m *Manager) removeHere(ctx context.Context, rec sandboxRec, keepHistory bool) error {
	m.dropSpare(rec.ID)
	if cg, err := cgroup.Load(m.cgroupName(rec.ID)); err == nil {
		if err := cg.Destroy(ctx); err != nil {
			return fmt.Errorf("remove %s: %w", rec.ID, err)
		}
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("remove %s: %w", rec.ID, err)
	}
	m.dropStandby(rec.ID, false)
	m.removeRetired(rec.ID)
	m.turnForget(rec.ID)
	if m.store != nil {
		m.store.Forget(rec.ID)
	}
	if err := m.net.Remove(rec.ID); err != nil {
		m.log.Warn("egress: cannot remove the sandbox's network", "sandbox", rec.ID, "err", err)
	}
	err := m.db.Update(func(tx *meta.Tx) error {
		if !keepHistory {
			if err := tx.DeletePrefix(meta.Turns, rec.ID+"/"); err != nil {
				return err
			}
		}
		if err := tx.DeletePrefix(meta.FailedCheckpoints, rec.ID+"/"); err != nil {
			return err
		}
		return tx.DeletePrefix(meta.Takeovers, rec.ID+"/")
	})
	if err != nil {
		return err
	}
	// The record goes first: from here on the sandbox is not listed, and
	// a crash leaves only unlisted directories, which start-up removes.
	if err := m.db.Delete(meta.Sandboxes, rec.ID); err != nil {
		return err
	}
	cks, err := m.checkpointsOf(rec.ID)
	if err != nil {
		return err
	}
	var stored []string
	for _, c := range cks {
		if err := m.deleteCheckpoint(c); err != nil {
			return fmt.Errorf("remove %s: %w", rec.ID, err)
		}
		if c.InStore {
			stored = append(stored, c.ID)
		}
	}
	if !keepHistory {
		// Removed, not moved: what it has in the store goes too.
		m.dropStored(rec.ID, rec.Head, stored, true)
	}
	if err := removeTree(m.sbDir(rec.ID)); err != nil {
		return fmt.Errorf("remove %s: %w", rec.ID, err)
	}
	m.dropQgroup(rec)
	m.tenants.Delete(rec.ID)
	if keepHistory {
		return nil
	}
	if err := m.ledger.Remove(rec.ID); err != nil {
		m.log.Warn("effect ledger: cannot remove the sandbox's", "sandbox", rec.ID, "err", err)
	}
	m.vault.Forget(rec.ID)
	return nil
}

// running returns the record of a sandbox whose init runs.
func (m *Manager) running(ref string) (sandboxRec, error) {
	rec, err := m.lookupSandbox(ref)
	if err != nil {
		return rec, err
	}
	if sb := m.report(rec); sb.State != v1.StateRunning {
		return rec, fmt.Errorf("sandbox %s is %s: %w", rec.ID, sb.State, errdefs.ErrFailedPrecondition)
	}
	return rec, nil
}

// Exec starts a command. For a detached command it returns the PID and a
// nil connection; otherwise it returns the connection to init, on which
// the exec stream (see api/v1 stream framing) follows.
func (m *Manager) Exec(ctx context.Context, ref string, req v1.ExecRequest) (int, net.Conn, error) {
	rec, err := m.running(ref)
	if err != nil {
		return 0, nil, err
	}
	execDefaults(rec, &req)
	if len(req.Args) == 0 {
		return 0, nil, fmt.Errorf("exec: no command, and the sandbox's image has no default command: %w", errdefs.ErrInvalidArgument)
	}
	ident := turn.ExecIdent(req.Args, req.Env, req.Cwd, req.User, req.Detach, req.Stdin, req.TimeoutMS)
	m.learnExecEnv(rec.ID, req.Env)
	if req.Aside {
		// Neither the agent's nor recorded.
	} else if x, ok := m.turns.Replay(rec.ID, turn.Request{Kind: turn.ExchangeExec, Ident: ident, What: "exec " + strings.Join(req.Args, " ")}); ok {
		if req.Detach {
			return x.Cmd.Pid, nil, nil
		}
		return 0, replayExec(*x.Cmd), nil
	}
	if err := m.turnGate(ctx, rec.ID); err != nil {
		return 0, nil, err
	}
	ireq := sbinit.Request{
		Op: "exec", Args: req.Args, Env: req.Env, Cwd: req.Cwd, User: req.User,
		TimeoutMS: req.TimeoutMS, Detach: req.Detach, Stdin: req.Stdin,
	}
	if req.Detach {
		resp, err := m.call(ctx, rec, ireq)
		if err != nil {
			return 0, nil, fmt.Errorf("exec: %w", err)
		}
		if !req.Aside {
			m.recordCommand(rec.ID, meta.TurnCommand{Time: time.Now().UTC(), Args: req.Args, Ident: ident, Detached: true, Pid: resp.Pid})
		}
		return resp.Pid, nil, nil
	}
	c, err := m.dial(context.Background(), rec)
	if err != nil {
		return 0, nil, err
	}
	if err := sandbox.SendRequest(c, ireq); err != nil {
		c.Close()
		return 0, nil, err
	}
	if req.Aside {
		return 0, c, nil
	}
	return 0, m.recording(rec.ID, c, meta.TurnCommand{Time: time.Now().UTC(), Args: req.Args, Ident: ident}), nil
}

// SessionRun runs shell text in the named persistent session.
func (m *Manager) SessionRun(ctx context.Context, ref, session string, req v1.SessionRunRequest) (meta.SessionRunResult, error) {
	if err := validName("session", session); err != nil {
		return meta.SessionRunResult{}, err
	}
	rec, err := m.running(ref)
	if err != nil {
		return meta.SessionRunResult{}, err
	}
	ident := turn.SessionIdent(session, req.Command, req.TimeoutMS)
	if req.Aside {
		// Neither the agent's nor recorded.
	} else if x, ok := m.turns.Replay(rec.ID, turn.Request{Kind: turn.ExchangeSession, Ident: ident, What: "session " + session + ": " + req.Command}); ok {
		c := x.Cmd
		return meta.SessionRunResult{
			Stdout: c.Stdout, Stderr: c.Stderr, ExitCode: c.ExitCode, TimedOut: c.TimedOut,
			Truncated: c.Truncated, DurationMS: int64(c.DurationMS), Replayed: true,
		}, nil
	}
	if err := m.turnGate(ctx, rec.ID); err != nil {
		return meta.SessionRunResult{}, err
	}
	began := time.Now().UTC()
	resp, err := m.call(ctx, rec, sbinit.Request{Op: "session-run", Session: session, Command: req.Command, TimeoutMS: req.TimeoutMS})
	if err != nil {
		return meta.SessionRunResult{}, fmt.Errorf("session %s: %w", session, err)
	}
	if !req.Aside {
		m.recordCommand(rec.ID, meta.TurnCommand{
			Time: began, Session: session, Command: req.Command, Ident: ident, ExitCode: resp.ExitCode,
			Stdout: resp.Stdout, Stderr: resp.Stderr, Truncated: resp.Truncated, TimedOut: resp.TimedOut,
			DurationMS: float64(resp.DurationMS),
		})
	}
	return meta.SessionRunResult{
		Stdout: resp.Stdout, Stderr: resp.Stderr, ExitCode: resp.ExitCode,
		TimedOut: resp.TimedOut, Truncated: resp.Truncated, DurationMS: resp.DurationMS,
	}, nil
}

// SessionClose ends a session.
func (m *Manager) SessionClose(ctx context.Context, ref, session string) error {
	if err := validName("session", session); err != nil {
		return err
	}
	rec, err := m.running(ref)
	if err != nil {
		return err
	}
	_, err = m.call(ctx, rec, sbinit.Request{Op: "session-close", Session: session})
	return err
}
