package core

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
)

// managerTarget is another Manager as a migration's target, as the
// daemon's client of the target's TCP API is.
type managerTarget struct{ m *Manager }

func (t managerTarget) Resume(ctx context.Context, id string, req v1.ResumeRequest) (string, error) {
	sb, err := t.m.ResumeWith(ctx, id, req)
	return sb.State, err
}

func (t managerTarget) String() string { return t.m.cfg.Root }

// TestMigrate moves a sandbox with a counter running and a shell
// session's variable set from one daemon to another sharing the store:
// first to a daemon that does not trust the first one's key, which
// refuses it (the sandbox runs on at the source, its counter going),
// then to one that does. There the counter goes on, the session keeps
// its variable, the source no longer has the sandbox, and a rollback to
// a checkpoint taken on the source brings back that checkpoint's files
// and session.
func TestMigrate(t *testing.T) {
	bucket := testBucket(t)
	m, second := trustingHosts(t, bucket)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	startCounter(t, m, sb.ID)
	run(t, m, sb.ID, "echo early > /f; V=early")
	early, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "echo late > /f; V=late")
	counting(t, m.sbRoot(sb.ID), 10)
	// A turn ended and an effect declared: the turn log and the ledger
	// move with the sandbox.
	t1 := endTurn(t, m, sb.ID)
	eff, err := m.DeclareEffect(ctx, sb.ID, v1.EffectDeclareRequest{Method: "POST", URL: "https://pay.example/charge", Status: 200, IdempotencyKey: "k-1"})
	if err != nil {
		t.Fatal(err)
	}

	// A target that does not trust the source's key refuses it.
	untrusting := openManagerStore(t, bucket)
	if _, err := m.Migrate(ctx, sb.ID, managerTarget{untrusting}); err == nil {
		t.Fatal("a daemon that does not trust the source's key took its sandbox")
	}
	if got, err := m.Sandbox(ctx, sb.ID); err != nil || got.State != v1.StateRunning {
		t.Fatalf("the source after a refused migration: %+v, %v", got, err)
	}
	c := lastCount(readFile(t, filepath.Join(m.sbRoot(sb.ID), "c")))
	counting(t, m.sbRoot(sb.ID), c)
	if out := run(t, m, sb.ID, "echo $V"); out.Stdout != "late\n" {
		t.Fatalf("the session after a refused migration: %q", out.Stdout)
	}
	if doc, err := m.store.Sandbox(ctx, sb.ID); err != nil || doc.Owner != m.cks.Keyring().KeyID() {
		t.Fatalf("the store's document after a refused migration: %+v, %v", doc, err)
	}

	m2 := second()
	mg, err := m.Migrate(ctx, sb.ID, managerTarget{m2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("migrated at checkpoint %s with %d checkpoints, down %.1f ms (upload %.1f ms, target's resume %.1f ms)", mg.Checkpoint, mg.Checkpoints, mg.DowntimeMS, mg.UploadMS, mg.ResumeMS)
	if mg.Checkpoints < 2 {
		t.Fatalf("migration: %+v", mg)
	}
	if _, err := m.Sandbox(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the source still has the migrated sandbox: %v", err)
	}
	if _, err := os.Lstat(m.sbDir(sb.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the source's directory of the migrated sandbox: %v", err)
	}
	got, err := m2.Sandbox(ctx, sb.ID)
	if err != nil || got.State != v1.StateRunning {
		t.Fatalf("the target: %+v, %v", got, err)
	}
	at := lastCount(readFile(t, filepath.Join(m2.sbRoot(sb.ID), "c")))
	if c := counting(t, m2.sbRoot(sb.ID), at); c <= at {
		t.Fatalf("counter at %d on the target", c)
	}
	if out := run(t, m2, sb.ID, "cat /f; echo $V"); out.Stdout != "late\nlate\n" {
		t.Fatalf("the session on the target: %q", out.Stdout)
	}
	if _, err := m.Resume(ctx, sb.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("the source resumed the sandbox the target runs: %v", err)
	}
	if turns, err := m2.Turns(sb.ID); err != nil || len(turns) == 0 || turns[len(turns)-1].Turn != t1.Turn {
		t.Fatalf("the target's turn log: %+v, %v; want turn %d last", turns, err, t1.Turn)
	}
	if effs, _, err := m2.Effects(ctx, sb.ID, ""); err != nil || len(effs) != 1 || effs[0].ID != eff.ID {
		t.Fatalf("the target's ledger: %+v, %v; want %s", effs, err, eff.ID)
	}
	if t2 := endTurn(t, m2, sb.ID); t2.Turn != t1.Turn+1 {
		t.Fatalf("the next turn on the target is %d, want %d", t2.Turn, t1.Turn+1)
	}

	// Back to the checkpoint taken on the source.
	if _, err := m2.Rollback(ctx, sb.ID, early.ID); err != nil {
		t.Fatal(err)
	}
	if out := run(t, m2, sb.ID, "cat /f; echo $V"); out.Stdout != "early\nearly\n" {
		t.Fatalf("after a rollback on the target to a checkpoint of the source: %q", out.Stdout)
	}
	cks, err := m2.Checkpoints(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, c := range cks {
		ids[c.ID] = true
	}
	if !ids[early.ID] || !ids[mg.Checkpoint] {
		t.Fatalf("the target's checkpoints %v lack %s or %s", ids, early.ID, mg.Checkpoint)
	}
}

// lostAnswer is a target that resumes the sandbox and then loses its
// answer (a timeout on the way back).
type lostAnswer struct{ managerTarget }

func (t lostAnswer) Resume(ctx context.Context, id string, req v1.ResumeRequest) (string, error) {
	if _, err := t.m.ResumeWith(ctx, id, req); err != nil {
		return "", err
	}
	return "", errors.New("connection reset by peer")
}

// TestMigrateAnswerLost: a target that resumed the sandbox but whose
// answer was lost leaves it running there only: the source stops its
// copy and may not resume it while the target holds it.
func TestMigrateAnswerLost(t *testing.T) {
	bucket := testBucket(t)
	m, second := trustingHosts(t, bucket)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "V=here")
	m2 := second()
	if _, err := m.Migrate(ctx, sb.ID, lostAnswer{managerTarget{m2}}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a migration whose answer was lost: %v", err)
	}
	if got, err := m.Sandbox(ctx, sb.ID); err != nil || got.State != v1.StateHibernated {
		t.Fatalf("the source after a lost answer: %+v, %v", got, err)
	}
	if _, err := m.Resume(ctx, sb.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("the source resumed a sandbox the target runs: %v", err)
	}
	if out := run(t, m2, sb.ID, "echo $V"); out.Stdout != "here\n" {
		t.Fatalf("the session on the target: %q", out.Stdout)
	}
}
