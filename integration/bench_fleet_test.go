package integration

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/bench"
	"github.com/molt-sh/molt/internal/objstore/s3test"
)

// TestBenchFleetSmoke runs molt bench fleet end to end on two sandboxes
// of a small trajectory against the local S3 server it starts: the runs
// in both modes, checkpoints in the store, the comparison and the
// projection filled in.
func TestBenchFleetSmoke(t *testing.T) {
	requireCRIU(t)
	s3test.Start(t) // skips (or fails under make test) without the server's binary
	dir := t.TempDir()
	cmds := []string{
		"mkdir -p /workspace/app && cd /workspace/app",
		"echo one > a.txt",
		"export MODE=x && echo two >> a.txt",
		"cat a.txt",
	}
	data := writeTrajectory(t, dir, "smoke__fleet-1", cmds)
	start := time.Now()
	cmd := exec.Command(env.bin, "--json", "bench", "fleet", "--data", data, "--runs", "1", "--sandboxes", "2",
		"--max-turns", "4", "--dir", dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("molt bench fleet: %v\n%s", err, stderr.String())
	}
	t.Logf("molt bench fleet took %v", time.Since(start).Round(time.Second))
	var res bench.FleetResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("decode: %v\n%s", err, out)
	}
	if len(res.Runs) != 2 || len(res.Sizes) != 1 {
		t.Fatalf("%d runs, %d sizes; want 2 and 1", len(res.Runs), len(res.Sizes))
	}
	if res.Warmup.Uploaded < 10<<20 {
		t.Errorf("the warm-up uploaded %d bytes: the image's files should have gone up", res.Warmup.Uploaded)
	}
	for _, r := range res.Runs {
		if r.Turns != 8 || r.Errors+r.EndErrors != 0 {
			t.Errorf("%s: %d turns, %d errors; want 8 and none", r.Mode, r.Turns, r.Errors+r.EndErrors)
		}
		switch r.Mode {
		case bench.ModeNone:
			if r.Checkpoints != 0 || r.Uploaded != 0 {
				t.Errorf("none checkpointed (%d) or uploaded (%d bytes)", r.Checkpoints, r.Uploaded)
			}
		case bench.ModeAuto:
			// Two file-changing turns and a session change each.
			if r.Checkpoints < 4 || r.StoreRequests == 0 || r.NotInStore != 0 {
				t.Errorf("auto: %d checkpoints, %d store requests, %d not in the store", r.Checkpoints, r.StoreRequests, r.NotInStore)
			}
		default:
			t.Errorf("mode %q", r.Mode)
		}
	}
	if p := res.Projection; p.TurnInterval <= 0 || p.StoreRPS <= 0 || p.Sandboxes != 256 {
		t.Errorf("projection %+v", p)
	}
}
