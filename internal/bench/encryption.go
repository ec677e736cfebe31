package bench

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/daemon"
)

// EncryptionConfig configures bench encryption.
type EncryptionConfig struct {
	Image    string
	CriuPath string // reported with the host's facts
	Rounds   int
	HeapMiB  int
	Progress io.Writer
}

// EncryptionRow is one operation of one workload, with encryption at
// rest off (Plain) and on (Sealed).
type EncryptionRow struct {
	Workload string `json:"workload"`
	Op       string `json:"op"`
	Plain    Stats  `json:"plain"`
	Sealed   Stats  `json:"sealed"`
	// Bytes ops report sizes, not times: PlainBytes and SealedBytes are
	// their medians.
	PlainBytes  int64 `json:"plain_bytes,omitempty"`
	SealedBytes int64 `json:"sealed_bytes,omitempty"`
}

// EncryptionResult is the outcome of RunEncryption.
type EncryptionResult struct {
	Host HostFacts       `json:"host"`
	Rows []EncryptionRow `json:"rows"`
}

// RestoreSettle is the pause before each warm and cold rollback of
// bench encryption: past the 2 s decrypted page images outlive a
// restore (core's pagesLinger).
const RestoreSettle = 3 * time.Second

// encSide is one daemon's samples of one workload.
type encSide struct {
	e                   *daemon.Ephemeral
	sb                  string
	first               bool
	stall, ck, warm     Sample
	cold, hot           Sample
	firstBytes, written []int64
}

// RunEncryption runs the same workloads on two daemons, one storing
// plaintext and one with encryption at rest (a KEK), round by round in
// alternating order: a full checkpoint after a small change (its stall,
// its latency to the commit, the bytes it writes), and rollbacks to it
// on each tier (hot from a standby, warm from the images, cold
// rehashing them first).
func RunEncryption(ctx context.Context, plain, sealed *daemon.Ephemeral, cfg EncryptionConfig) (EncryptionResult, error) {
	progress := progressf(cfg.Progress)
	res := EncryptionResult{Host: GatherHost(ctx, plain.Client, cfg.CriuPath)}
	pw := processWorkloads(ctx, plain.Client, cfg.HeapMiB)
	sw := processWorkloads(ctx, sealed.Client, cfg.HeapMiB)
	for wi := range pw {
		progress("encryption: %s", pw[wi].name)
		sides := []*encSide{{e: plain}, {e: sealed}}
		for i, w := range []workload{pw[wi], sw[wi]} {
			sb, err := w.start(ctx, cfg.Image)
			if err != nil {
				return res, err
			}
			sides[i].sb = sb.ID
		}
		for r := 0; r < cfg.Rounds; r++ {
			order := sides
			if r%2 == 1 {
				order = []*encSide{sides[1], sides[0]}
			}
			for _, s := range order {
				if err := s.round(ctx, r); err != nil {
					return res, err
				}
			}
		}
		p, s := sides[0], sides[1]
		row := func(op string, a, b Sample) EncryptionRow {
			return EncryptionRow{Workload: pw[wi].name, Op: op, Plain: a.Stats(), Sealed: b.Stats()}
		}
		res.Rows = append(res.Rows,
			row("stall", p.stall, s.stall), row("checkpoint (to commit)", p.ck, s.ck),
			row("rollback hot", p.hot, s.hot), row("rollback warm", p.warm, s.warm), row("rollback cold", p.cold, s.cold),
			EncryptionRow{Workload: pw[wi].name, Op: "first checkpoint writes", PlainBytes: medianBytes(p.firstBytes), SealedBytes: medianBytes(s.firstBytes)},
			EncryptionRow{Workload: pw[wi].name, Op: "next checkpoint writes", PlainBytes: medianBytes(p.written), SealedBytes: medianBytes(s.written)})
		for _, x := range sides {
			if err := x.e.Client.Remove(ctx, x.sb); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// round is one round on one daemon: a change, a full checkpoint, and a
// rollback to it on each tier.
func (s *encSide) round(ctx context.Context, r int) error {
	c := s.e.Client
	if _, err := c.SessionRun(ctx, s.sb, "main", v1.SessionRunRequest{Command: fmt.Sprintf("export N=%d; touch /tmp/poke", r)}); err != nil {
		return err
	}
	time.Sleep(100 * time.Millisecond)
	t0 := time.Now()
	ck, err := c.Checkpoint(ctx, s.sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		return err
	}
	s.ck = append(s.ck, time.Since(t0))
	s.stall = append(s.stall, msDur(ck.StallMS))
	if !s.first {
		s.first = true
		s.firstBytes = append(s.firstBytes, ck.BytesWritten)
	} else {
		s.written = append(s.written, ck.BytesWritten)
	}
	if err := waitStandby(ctx, s.e, s.sb, ck.ID); err != nil {
		return err
	}
	for _, tier := range []string{v1.TierHot, v1.TierWarm, v1.TierCold} {
		req := v1.RollbackRequest{Checkpoint: ck.ID, Tier: tier}
		if tier == v1.TierHot {
			req.Tier = ""
		} else {
			// Longer than decrypted page images linger after a restore
			// (the standby's, the previous tier's): each warm and cold
			// restore here decrypts what it reads, as one that follows
			// no other does. Both daemons wait the same.
			time.Sleep(RestoreSettle)
		}
		t0 := time.Now()
		got, err := c.RollbackWith(ctx, s.sb, req)
		if err != nil {
			return err
		}
		d := time.Since(t0)
		if got.Tier != tier {
			return fmt.Errorf("rollback asked %q took tier %s", tier, got.Tier)
		}
		switch tier {
		case v1.TierHot:
			s.hot = append(s.hot, d)
		case v1.TierWarm:
			s.warm = append(s.warm, d)
		default:
			s.cold = append(s.cold, d)
		}
	}
	return nil
}

func medianBytes(v []int64) int64 {
	f := make([]float64, len(v))
	for i, x := range v {
		f[i] = float64(x)
	}
	return int64(median(f))
}

// PrintEncryption writes the result: each operation off and on, and the
// ratio (sealed / plain).
func PrintEncryption(w io.Writer, r EncryptionResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "workload\toperation\tplaintext p50 / tail\tencrypted p50 / tail\tencrypted / plaintext")
	for _, row := range r.Rows {
		if row.Plain.N == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", row.Workload, row.Op, human(row.PlainBytes), human(row.SealedBytes),
				RatioString(float64(row.SealedBytes), float64(row.PlainBytes)))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", row.Workload, row.Op, p50Tail(row.Plain), p50Tail(row.Sealed),
			RatioString(row.Sealed.P50, row.Plain.P50))
	}
	tw.Flush()
}
