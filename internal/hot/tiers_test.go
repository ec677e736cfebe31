package hot

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/meta"
)

// fakeTarget records the steps a rollback took.
type fakeTarget struct {
	requested       string
	standby         bool
	verifyFails     bool
	promoteFails    bool
	procs, full     bool
	verifyProcFails bool
	restoreFails    bool
	steps           []string
}

var errFake = errors.New("fake")

func (f *fakeTarget) step(s string) { f.steps = append(f.steps, s) }

func (f *fakeTarget) Requested() string { return f.requested }
func (f *fakeTarget) TakeStandby() *Standby {
	f.step("take")
	if !f.standby {
		return nil
	}
	return &Standby{}
}
func (f *fakeTarget) DiscardStandby(*Standby) { f.step("discard") }
func (f *fakeTarget) VerifyTarget() error {
	f.step("verify")
	if f.verifyFails {
		return errFake
	}
	return nil
}
func (f *fakeTarget) Promote(context.Context, *Standby) (meta.RollbackResult, error) {
	f.step("promote")
	if f.promoteFails {
		return meta.RollbackResult{}, errFake
	}
	return meta.RollbackResult{Tier: v1.TierHot}, nil
}
func (f *fakeTarget) Processes() (bool, bool) { return f.procs, f.full }
func (f *fakeTarget) VerifyProcesses() error {
	f.step("rehash")
	if f.verifyProcFails {
		return errFake
	}
	return nil
}
func (f *fakeTarget) Restore(context.Context) (meta.RollbackResult, error) {
	f.step("restore")
	if f.restoreFails {
		return meta.RollbackResult{}, errFake
	}
	return meta.RollbackResult{Tier: v1.TierWarm}, nil
}
func (f *fakeTarget) Restart(context.Context) (meta.RollbackResult, error) {
	f.step("restart")
	return meta.RollbackResult{Tier: v1.TierRestart}, nil
}
func (f *fakeTarget) Fallback(tier string, err error) { f.step("fallback " + tier) }

// The tiers are chosen as core's rollback chose them before the table:
// the same tier, the same steps, for every request and state.
func TestTiers(t *testing.T) {
	cases := []struct {
		name    string
		target  fakeTarget
		tier    string // "" for an error
		steps   string
		wantErr bool
	}{
		{"standby promoted", fakeTarget{standby: true, procs: true, full: true}, v1.TierHot, "take verify promote", false},
		{"hot asked, standby promoted", fakeTarget{requested: v1.TierHot, standby: true, procs: true, full: true}, v1.TierHot, "take verify promote", false},
		{"damaged target refused despite standby", fakeTarget{standby: true, verifyFails: true, procs: true, full: true}, "", "take verify discard", true},
		{"standby not promoted, restored", fakeTarget{standby: true, promoteFails: true, procs: true, full: true}, v1.TierWarm, "take verify promote fallback hot restore", false},
		{"no standby", fakeTarget{procs: true, full: true}, v1.TierWarm, "take restore", false},
		{"hot asked, no standby", fakeTarget{requested: v1.TierHot, procs: true, full: true}, v1.TierWarm, "take restore", false},
		{"warm asked skips the standby", fakeTarget{requested: v1.TierWarm, standby: true, procs: true, full: true}, v1.TierWarm, "restore", false},
		{"cold rehashes first", fakeTarget{requested: v1.TierCold, standby: true, procs: true, full: true}, v1.TierCold, "rehash restore", false},
		{"cold refused on a bad object", fakeTarget{requested: v1.TierCold, procs: true, full: true, verifyProcFails: true}, "", "rehash", true},
		{"full restore failure is the rollback's", fakeTarget{procs: true, full: true, restoreFails: true}, "", "take restore", true},
		{"fs target: ancestor's processes", fakeTarget{procs: true}, v1.TierWarm, "take restore", false},
		{"fs target: ancestor does not fit, restart", fakeTarget{procs: true, restoreFails: true}, v1.TierRestart, "take restore fallback warm restart", false},
		{"cold fs target: ancestor does not fit, restart", fakeTarget{requested: v1.TierCold, procs: true, restoreFails: true}, v1.TierRestart, "rehash restore fallback cold restart", false},
		{"no processes anywhere", fakeTarget{}, v1.TierRestart, "take restart", false},
		{"cold, no processes: no rehash", fakeTarget{requested: v1.TierCold}, v1.TierRestart, "restart", false},
		{"warm, no processes", fakeTarget{requested: v1.TierWarm}, v1.TierRestart, "restart", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := c.target
			res, err := Run(context.Background(), &f)
			if (err != nil) != c.wantErr {
				t.Fatalf("err %v, want error %v", err, c.wantErr)
			}
			if err == nil && res.Tier != c.tier {
				t.Errorf("tier %q, want %q", res.Tier, c.tier)
			}
			if got := strings.Join(f.steps, " "); got != c.steps {
				t.Errorf("steps %q, want %q", got, c.steps)
			}
		})
	}
}

// The table walks the tiers in the documented order, and every tier the
// API reports has a row.
func TestTierOrder(t *testing.T) {
	var names []string
	for _, tr := range tiers {
		names = append(names, tr.name)
	}
	if !slices.Equal(names, Tiers) {
		t.Fatalf("table %v, order %v", names, Tiers)
	}
	for _, n := range []string{v1.TierHot, v1.TierWarm, v1.TierCold, v1.TierRestart} {
		if !slices.Contains(names, n) {
			t.Errorf("no tier %q", n)
		}
	}
}
