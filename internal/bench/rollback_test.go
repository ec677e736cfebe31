package bench

import (
	"bytes"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
)

// TestPrintRollback: the targets are judged from the numbers, the p99
// only where there are 100 samples (else the max, named so), every tier
// is a ratio to the main cold baseline, and the stall's parts, captures,
// tiers taken and the write-fault cost are printed per workload.
func TestPrintRollback(t *testing.T) {
	var buf bytes.Buffer
	PrintRollback(&buf, RollbackResult{Rows: []RollbackRow{{
		Workload:     "python",
		Stall:        Stats{N: 15, P50: 27.9},
		StallParts:   v1.StallParts{ProtectMS: 6.5, CRIUMS: 19.25, SnapshotMS: 2, CopyMS: 0},
		Captures:     map[string]int{"copy-on-write": 14, "copy": 1},
		Hot:          Stats{N: 20, P50: 2.2, P95: 4, Max: 25.6},
		BackToBack:   Stats{N: 20, P50: 30, Max: 40},
		BackTiers:    map[string]int{"hot": 1, "warm": 19},
		AfterRestart: Stats{N: 3, P50: 90, Max: 95},
		RestartTiers: map[string]int{"warm": 3},
		Cold:         []ColdRow{{Method: "main", Stats: Stats{N: 10, P50: 220, Max: 300}}, {Method: "defaults", Stats: Stats{N: 10, P50: 440, Max: 500}}},
		Rewrite:      &Stats{N: 5, P50: 10}, RewriteAfter: &Stats{N: 5, P50: 35}, RewriteCaps: map[string]int{"template": 5},
	}, {
		Workload: "bash",
		Stall:    Stats{N: 15, P50: 8},
		Hot:      Stats{N: 100, P50: 2, P99: 6, Max: 50},
	}}})
	out := buf.String()
	for _, want := range []string{
		"python: hot p50 2.2 ms (target <= 5: met), max 25.6 ms (target p99 <= 20: MISSED); checkpoint stall p50 27.9 ms (target <= 15: MISSED)",
		"bash: hot p50 2.0 ms (target <= 5: met), p99 6.0 ms (target p99 <= 20: met); checkpoint stall p50 8.0 ms (target <= 15: met)",
		"python: stall parts p50: copying the tree 0.0 ms, write protection 6.5 ms, CRIU 19.2 ms, root snapshot 2.0 ms beside them; captures: copy 1, copy-on-write 14",
		"python: writing every heap page takes 35.0 ms p50 right after a full checkpoint (template 5) vs 10.0 ms without one: 3.50x, 25.0 ms of write faults",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, re := range []string{
		`hot \(standby ready\)\s+2\.2 ms\s+4\.0 ms\s+max 25\.6 ms\s+20\s+100\.00x`,
		`back to back \(no wait for the standby\)\s+30\.0 ms.*7\.33x\s+hot 1, warm 19`,
		`first after a daemon restart\s+90\.0 ms.*max 95\.0 ms\s+3\s+2\.44x\s+warm 3`,
		`cold baseline: defaults \+ criu restore\s+440\.0 ms.*0\.50x`,
		// No cold baseline measured: no ratio.
		`bash\s+hot \(standby ready\)\s+2\.0 ms\s+0\.0 ms\s+p99 6\.0 ms\s+100\s+-`,
	} {
		if !matches(re, out) {
			t.Errorf("output lacks /%s/:\n%s", re, out)
		}
	}
	if strings.Contains(out, "random of the last") {
		t.Errorf("a tier without samples is printed:\n%s", out)
	}
}

// TestPrintCR: each baseline's ratios are printed, the stall target
// against the main one, tails as max below 100 samples.
func TestPrintCR(t *testing.T) {
	var buf bytes.Buffer
	PrintCR(&buf, CRResult{Rows: []CRRow{{
		Workload: "idle bash session", Stall: Stats{N: 10, P50: 8}, Checkpoint: Stats{N: 10, P50: 12, Max: 20},
		Rollback: Stats{N: 10, P50: 30, Max: 35}, FirstBytes: 1 << 20, SecondBytes: 64 << 10, ImageBytes: 1 << 20,
		Baselines: []CRBaseline{
			{Method: "criu, molt's options", Stall: Stats{N: 5, P50: 16}, Dump: Stats{N: 5, P50: 48, Max: 50}, Restore: Stats{N: 5, P50: 60, Max: 70}},
			{Method: "criu defaults", Stall: Stats{N: 5, P50: 4}, Dump: Stats{N: 5, P50: 96}, Restore: Stats{N: 5, P50: 120}},
		},
	}}})
	out := buf.String()
	for _, want := range []string{
		"idle bash session: second checkpoint wrote 64.0 KiB = 6.2% of a full dump (1 MiB); target <= 13%: met",
		"idle bash session: vs criu, molt's options: stall 0.50x, checkpoint 0.25x, rollback 0.50x (molt / baseline, p50s); target stall no longer than CRIU's own dump: met",
		"idle bash session: vs criu defaults: stall 2.00x, checkpoint 0.12x, rollback 0.25x (molt / baseline, p50s)\n",
		"max 20.0 ms", "max 70.0 ms",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "p99") {
		t.Errorf("p99 printed from 10 samples:\n%s", out)
	}
}

// TestPrintSearch: rates are medians with the spread, molt is a ratio
// to every baseline, the target is judged against the main baseline.
func TestPrintSearch(t *testing.T) {
	var buf bytes.Buffer
	PrintSearch(&buf, SearchResult{Rounds: 3, Rows: []SearchRow{
		{Method: searchMolt, NodesPerMin: RoundsOf([]float64{900, 1000, 1100})},
		{Method: searchReflink, Baseline: true, NodesPerMin: RoundsOf([]float64{110, 100, 90})},
		{Method: searchPython, Baseline: true, NodesPerMin: RoundsOf([]float64{40, 50, 60})},
	}})
	out := buf.String()
	for _, re := range []string{
		`molt \(full checkpoints, rollback\)\s+1000 \(900-1100\)\s+-`,
		`cp -a --reflink=always\)\s+100 \(90-110\)\s+10\.00x`,
		`shutil\.copytree\)\s+50 \(40-60\)\s+20\.00x`,
		`molt expands 10\.0x the nodes of copytree \+ replay \(cp -a --reflink=always\) \(medians; 8\.2x worst round against best; target >= 10x: met\)`,
	} {
		if !matches(re, out) {
			t.Errorf("output lacks /%s/:\n%s", re, out)
		}
	}
	buf.Reset()
	PrintSearch(&buf, SearchResult{Rounds: 1, Rows: []SearchRow{
		{Method: searchMolt, NodesPerMin: RoundsOf([]float64{500})},
		{Method: searchReflink, Baseline: true, NodesPerMin: RoundsOf([]float64{100})},
	}})
	if out := buf.String(); !strings.Contains(out, "fewer than 3") || !strings.Contains(out, "target >= 10x: MISSED") {
		t.Errorf("one round:\n%s", out)
	}
}
