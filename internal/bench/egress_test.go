package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/molt-sh/molt/internal/testutil"
)

// TestRunEgressSmall runs the egress bench at a tiny size: every
// workload completes through molt and directly, the recorded sandboxes'
// requests are in the ledger and the direct one's are not.
func TestRunEgressSmall(t *testing.T) {
	testutil.RequireRoot(t)
	res, err := RunEgress(context.Background(), EgressConfig{Requests: 20, Bytes: 1 << 20, Rounds: 2, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 11 {
		t.Fatalf("%d rows, want 11: %+v", len(res.Rows), res.Rows)
	}
	for _, r := range res.Rows {
		switch {
		case r.Molt != nil:
			if r.Molt.N != 20 || r.Direct.N != 20 || r.Molt.P50 <= 0 || r.Direct.P50 <= 0 {
				t.Errorf("%s %s: samples %+v / %+v", r.Proto, r.Workload, r.Molt, r.Direct)
			}
		case r.MoltRate == nil || r.MoltRate.N != 2 || r.DirectRate.N != 2 || r.MoltRate.Median <= 0:
			t.Errorf("%s %s: rates %+v / %+v", r.Proto, r.Workload, r.MoltRate, r.DirectRate)
		}
	}
	// HTTP and inspected HTTPS are recorded per request (20 warm-up +
	// 20 measured per latency workload, 3 per transfer workload), HTTPS
	// without inspection per connection (40 new connections, a few
	// kept alive). The direct sandbox's requests are not recorded.
	if got := res.Records; got["recorded"] < 40+40+3+40+40+3 || got["inspected"] < 40+40+3+40 || got["direct"] != 0 {
		t.Errorf("ledger records %v, want every request through molt and none of the direct sandbox's", got)
	}
	var out bytes.Buffer
	PrintEgress(&out, res)
	for _, want := range []string{"direct (NAT)", "through molt", "https-inspect", "p50 added < 1 ms", "within 20% of direct"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
