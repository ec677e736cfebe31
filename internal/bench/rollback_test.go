package bench

import (
	"bytes"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
)

// TestPrintRollback: the targets are judged from the numbers, and the
// stall's parts and captures are printed per workload.
func TestPrintRollback(t *testing.T) {
	var buf bytes.Buffer
	PrintRollback(&buf, RollbackResult{Rows: []RollbackRow{{
		Workload:   "python",
		Stall:      Stats{N: 15, P50: 27.9},
		StallParts: v1.StallParts{ProtectMS: 6.5, CRIUMS: 19.25, SnapshotMS: 2, CopyMS: 0},
		Captures:   map[string]int{"copy-on-write": 14, "copy": 1},
		Hot:        Stats{N: 20, P50: 2.2, P99: 5.6},
	}}})
	out := buf.String()
	for _, want := range []string{
		"python: hot p50 2.2 ms (target <= 5: met), p99 5.6 ms (target <= 20: met); checkpoint stall p50 27.9 ms (target <= 15: MISSED)",
		"python: stall parts p50: copying the tree 0.0 ms, write protection 6.5 ms, CRIU 19.2 ms, root snapshot 2.0 ms beside them; captures: copy 1, copy-on-write 14",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
