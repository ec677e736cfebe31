package core

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/progress"
	"github.com/molt-sh/molt/internal/remote"
)

// Migration (docs/storage.md, "Migration"): a running sandbox moves to
// another daemon that shares this one's object store and trusts its
// host key. Its committed checkpoints are uploaded while it runs; then
// a full checkpoint is taken and the sandbox stays frozen while that
// checkpoint (what the store lacks of it) and a signed document naming
// the whole lineage are written, and the target resumes it from the
// store (adopt, claim, fetch, restore). Only once the target reports it
// running are the processes here killed and the sandbox removed from
// this daemon; its checkpoints stay in the store, where the target
// fetches any it rolls back to.
//
// At no moment may both hosts run it. Until the target claims the
// store's document, a failure leaves the source the owner: it claims
// the document back and thaws. If the target claimed it and did not say
// it runs (a timeout, a lost answer), the source cannot know: it stops
// its processes and stays hibernated at the final checkpoint, marked
// offloaded, so a resume here must claim the document first.

// MigrateTarget is the daemon a sandbox migrates to. The engine's one
// call to it resumes a sandbox from the shared store; the HTTP layer
// makes one of the TCP API's client (TLS and a token), tests one of
// another Manager.
type MigrateTarget interface {
	// Resume resumes sandbox id from the store, with req (what the
	// source hands over), and returns its state on the target.
	Resume(ctx context.Context, id string, req v1.ResumeRequest) (string, error)
	// String names the target in errors and logs.
	String() string
}

// Migrate moves running sandbox ref to the daemon to.
func (m *Manager) Migrate(ctx context.Context, ref string, to MigrateTarget) (meta.Migration, error) {
	if err := m.storeReady(); err != nil {
		return meta.Migration{}, fmt.Errorf("migrate: %w", err)
	}
	rec, err := m.lookupSandbox(ref)
	if err != nil {
		return meta.Migration{}, err
	}
	if err := m.pipe.wait(ctx, "", rec.ID); err != nil {
		return meta.Migration{}, err
	}
	if err := m.migratable(rec); err != nil {
		return meta.Migration{}, fmt.Errorf("migrate %s: %w", rec.ID, err)
	}
	// While it runs: what the store lacks of its committed checkpoints.
	progress.Report(ctx, progress.Step{Message: "uploading the sandbox's checkpoints"})
	if _, err := m.uploadLineage(ctx, rec.ID, true); err != nil {
		return meta.Migration{}, fmt.Errorf("migrate %s: %w", rec.ID, err)
	}
	sent, took := m.precopy(ctx, rec)
	progress.Report(ctx, progress.Step{Message: "capturing processes and files"})
	start := time.Now()
	ck, err := m.checkpoint(ctx, rec.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true}, true)
	if err != nil {
		return meta.Migration{}, errors.Join(fmt.Errorf("migrate %s: %w", rec.ID, err), m.thawSandbox(rec.ID))
	}
	rec, unlock, err := m.lockSandbox(ck.Sandbox)
	if err != nil {
		return meta.Migration{}, errors.Join(err, m.thawSandbox(ck.Sandbox))
	}
	defer unlock()
	mg := meta.Migration{Sandbox: rec.ID, Target: to.String(), Checkpoint: ck.ID, PrecopyMS: ms(took), PrecopySentBytes: sent}
	up := time.Now()
	n, err := m.handOver(ctx, rec, ck.ID)
	if err != nil {
		return meta.Migration{}, errors.Join(fmt.Errorf("migrate %s: %w", rec.ID, err), m.thawSandbox(rec.ID))
	}
	mg.Checkpoints = n
	mg.UploadMS = ms(time.Since(up))
	progress.Report(ctx, progress.Step{Message: "resuming on " + to.String()})
	m.crashpoint("migrate:handed-over")
	res := time.Now()
	state, err := to.Resume(ctx, rec.ID, m.handover(rec))
	if err == nil && state != v1.StateRunning {
		err = fmt.Errorf("the target reports the sandbox %s: %w", state, errdefs.ErrUnavailable)
	}
	if err != nil {
		return meta.Migration{}, m.migrateFailed(ctx, rec, ck.ID, to, err)
	}
	mg.ResumeMS, mg.DowntimeMS = ms(time.Since(res)), ms(time.Since(start))
	progress.Report(ctx, progress.Step{Message: "stopping the sandbox here"})
	if err := m.removeHere(ctx, rec, true); err != nil {
		// It runs on the target: what stays here is garbage.
		m.log.Warn("migrate: the sandbox runs on the target, but its copy here was not all removed", "sandbox", rec.ID, "err", err)
	}
	m.log.Info("sandbox migrated", "sandbox", rec.ID, "target", to.String(), "checkpoint", ck.ID, "downtime_ms", mg.DowntimeMS)
	return mg, nil
}

// migratable refuses, before anything is frozen, a sandbox another host
// could not resume.
func (m *Manager) migratable(rec sandboxRec) error {
	if st := m.report(rec).State; st != v1.StateRunning {
		return fmt.Errorf("the sandbox is %s, not running (a hibernated one moves with hibernate --offload and resume): %w", st, errdefs.ErrFailedPrecondition)
	}
	if rec.IDs.Enabled() {
		return fmt.Errorf("the sandbox has a user namespace of this host's ids; moving it to another host is not supported yet: %w", errdefs.ErrNotSupported)
	}
	if c := rec.Compensation; c != nil && c.State == v1.CompensationRunning {
		return fmt.Errorf("the sandbox's compensations of its rollback to %s are under way: %w", c.Checkpoint, errdefs.ErrFailedPrecondition)
	}
	// Its turn log and ledger must be able to move (not sealed).
	if _, err := m.exportHistory(rec.ID); err != nil {
		return err
	}
	cks, err := m.checkpointsOf(rec.ID)
	if err != nil {
		return err
	}
	for _, c := range cks {
		if c.DataKey != "" {
			return fmt.Errorf("checkpoint %s is encrypted with a data key of this host's; moving it to another host is not supported yet: %w", c.ID, errdefs.ErrNotSupported)
		}
	}
	return nil
}

// handover is what the target of sandbox rec's migration gets with its
// resume, over the migration's TLS channel, and the store never holds:
// the private key of its egress proxy's CA, and the names it resolved
// through this host's DNS, signed by this host.
func (m *Manager) handover(rec sandboxRec) v1.ResumeRequest {
	var h v1.Handover
	if rec.Egress != nil {
		h.EgressCAKey = rec.Egress.CAKey
	}
	if rec.Network == v1.NetworkEgress && m.net != nil {
		for _, r := range m.net.Names().Export(rec.ID) {
			if len(h.Names) == v1.MaxHandoverNames {
				break
			}
			h.Names = append(h.Names, v1.ResolvedName{Name: r.Name, Addr: r.Addr.String(), Expires: r.Expires.UTC()})
		}
		if len(h.Names) > 0 {
			sig := m.cks.Keyring().SignBytes(namesSigned(rec.ID, h.Names))
			h.NamesKey, h.NamesSignature = sig.Key, sig.Sig
		}
	}
	if h.EgressCAKey == "" && len(h.Names) == 0 {
		return v1.ResumeRequest{}
	}
	return v1.ResumeRequest{Handover: &h}
}

// namesSigned is what a handover's names are signed over.
func namesSigned(id string, names []v1.ResolvedName) []byte {
	b := []byte("molt-names-v1\x00" + id + "\x00")
	for _, n := range names {
		b = fmt.Appendf(b, "%s\x00%s\x00%d\n", n.Name, n.Addr, n.Expires.UnixNano())
	}
	return b
}

// uploadLineage uploads sandbox id's committed checkpoints the store
// lacks, and returns the IDs of those it holds. trim trims the local
// cache after each (not under id's lock).
func (m *Manager) uploadLineage(ctx context.Context, id string, trim bool) ([]string, error) {
	cks, err := m.checkpointsOf(id)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, c := range cks {
		if c.Pending || c.Failed || c.DataKey != "" {
			continue
		}
		if !c.InStore {
			up := m.putCheckpoint
			if trim {
				up = m.uploadCheckpoint
			}
			if err := up(ctx, nil, c.ID); err != nil {
				return nil, err
			}
		}
		ids = append(ids, c.ID)
	}
	return ids, nil
}

// handOver puts what the target needs into the store: the final
// checkpoint head, then the sandbox's document naming its lineage, with
// no owner. It returns how many checkpoints the document names.
//
// Preconditions: rec's lock is held; rec is frozen at head.
func (m *Manager) handOver(ctx context.Context, rec sandboxRec, head string) (int, error) {
	if rec.Head != head {
		return 0, fmt.Errorf("the sandbox moved to %s while checkpoint %s was stored: %w", rec.Head, head, errdefs.ErrUnavailable)
	}
	var ck checkpointRec
	if err := m.db.Get(meta.Checkpoints, head, &ck); err != nil {
		return 0, err
	}
	if ck.DataKey != "" {
		return 0, fmt.Errorf("checkpoint %s is encrypted with a data key of this host's; moving it to another host is not supported yet: %w", head, errdefs.ErrNotSupported)
	}
	progress.Report(ctx, progress.Step{Message: "uploading checkpoint " + head})
	if err := m.putCheckpoint(ctx, nil, head); err != nil {
		return 0, err
	}
	// Those uploaded since (the background uploads of newer ones).
	lineage, err := m.uploadLineage(ctx, rec.ID, false)
	if err != nil {
		return 0, err
	}
	doc := remote.SandboxDoc{Sandbox: rec.ID, Name: rec.Name, Tenant: rec.Tenant, Head: head}
	for _, id := range lineage {
		if id != head {
			doc.Checkpoints = append(doc.Checkpoints, id)
		}
	}
	if err := m.putHistory(ctx, rec.ID, &doc); err != nil {
		return 0, err
	}
	hib := rec
	hib.State, hib.Offloaded = v1.StateHibernated, true
	if doc.Record, err = storedRecord(hib); err != nil {
		return 0, err
	}
	if err := m.putOwnDoc(ctx, &doc); err != nil {
		return 0, err
	}
	return len(doc.Checkpoints) + 1, nil
}

// migrateFailed handles a target that did not report sandbox rec
// running: cause is why. Unless the target claimed the sandbox, this
// host claims it back and thaws it; otherwise it stops it here.
//
// Preconditions: rec's lock is held; rec is frozen at head.
func (m *Manager) migrateFailed(ctx context.Context, rec sandboxRec, head string, to MigrateTarget, cause error) error {
	cause = fmt.Errorf("migrate %s to %s: %w", rec.ID, to, cause)
	// The store may be what failed: the claim back gets its own time.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	me := m.cks.Keyring().KeyID()
	doc, version, err := m.store.SandboxVersion(cctx, rec.ID)
	if err == nil && (doc.Owner == "" || doc.Owner == me) {
		// Over the version read: the target's claim and this one do not
		// both succeed.
		doc.Owner, doc.Epoch = me, doc.Epoch+1
		if err = m.store.PutSandbox(cctx, doc, version); err == nil {
			return errors.Join(cause, m.thawSandbox(rec.ID))
		}
	}
	if err == nil {
		err = fmt.Errorf("host %s claimed it", doc.Owner)
	}
	// The target may run it: it must not run here too.
	next := rec
	next.Offloaded = true
	_, serr := m.stopTree(ctx, next, v1.StateHibernated, "migration to "+to.String()+" undecided: hibernated at checkpoint "+head)
	if serr != nil {
		// Not stopped: it stays frozen rather than run twice.
		return errors.Join(cause, fmt.Errorf("the store's document could not be claimed back (%v), and stopping the sandbox here failed: it stays frozen: %w", err, serr))
	}
	if terr := m.thawSandbox(rec.ID); terr != nil {
		m.log.Warn("cannot thaw a stopped sandbox's empty cgroup", "sandbox", rec.ID, "err", terr)
	}
	return errors.Join(cause, fmt.Errorf("the store's document could not be claimed back (%v): the sandbox may run on the target; here it is hibernated at checkpoint %s and resumes only if it can claim the document: %w", err, head, errdefs.ErrConflict))
}

// MigrateTo migrates sandbox ref to the daemon whose TCP API req names
// (Migrate), reached over TLS with a token of the sandbox's tenant there.
func (m *Manager) MigrateTo(ctx context.Context, ref string, req v1.MigrateRequest) (meta.Migration, error) {
	c, endpoint, err := client.ForMigration(req)
	if err != nil {
		return meta.Migration{}, err
	}
	return m.Migrate(ctx, ref, remoteTarget{c: c, endpoint: endpoint})
}

// remoteTarget is a daemon's TCP API as a migration's target.
type remoteTarget struct {
	c        *client.Client
	endpoint string
}

func (t remoteTarget) Resume(ctx context.Context, id string, req v1.ResumeRequest) (string, error) {
	sb, err := t.c.ResumeWith(ctx, id, req)
	return sb.State, err
}

func (t remoteTarget) String() string { return t.endpoint }

// StoredSandbox is sandbox id as the store's document has it: its ID,
// name and tenant, hibernated and offloaded. Only a full ID is looked up.
func (m *Manager) StoredSandbox(ctx context.Context, id string) (meta.Sandbox, error) {
	if m.store == nil {
		return meta.Sandbox{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	doc, err := m.store.Sandbox(ctx, id)
	if err != nil {
		return meta.Sandbox{}, err
	}
	return meta.Sandbox{ID: doc.Sandbox, Name: doc.Name, Tenant: doc.Tenant, State: v1.StateHibernated, Offloaded: true, Head: doc.Head}, nil
}
