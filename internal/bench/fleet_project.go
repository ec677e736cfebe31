// Projecting the fleet benchmark's measured per-turn costs to a bigger
// host and to a fleet of them (docs/scale.md).

package bench

import (
	"fmt"
	"io"
	"time"
)

// ProjectConfig is the host and fleet the measured costs are projected
// to.
type ProjectConfig struct {
	Cores   int     // of the projected host
	PerCore float64 // sandboxes per core
	Hosts   int     // in the fleet
	// TurnInterval is a real agent's time from one turn to the next (its
	// LLM call and its command); 0: the trajectories' LLM waits before
	// scaling plus the commands' mean time as measured.
	TurnInterval time.Duration
}

// Projection is what molt costs on the projected host and fleet, from
// the per-turn costs measured at the largest size.
type Projection struct {
	From         int     `json:"from_sandboxes"`
	TurnInterval float64 `json:"turn_interval_s"`
	IntervalFrom string  `json:"interval_from"`
	Cores        int     `json:"cores"`
	Sandboxes    int     `json:"sandboxes_per_host"`
	Hosts        int     `json:"hosts"`
	// Per host.
	TurnsPerS  float64 `json:"turns_per_second"`
	CPUCores   float64 `json:"molt_cpu_cores"`
	CPUShare   float64 `json:"molt_cpu_share"`
	DiskMBps   float64 `json:"disk_mb_per_second"`
	UploadMBps float64 `json:"upload_mb_per_second"`
	StoreRPS   float64 `json:"store_requests_per_second"`
	// The fleet.
	FleetTurnsPerS  float64 `json:"fleet_turns_per_second"`
	FleetUploadGBps float64 `json:"fleet_upload_gb_per_second"`
	FleetStoreRPS   float64 `json:"fleet_store_requests_per_second"`
}

// project projects the largest size's per-turn costs. waits are the
// simulated LLM waits used (scaled by scale).
func project(cfg ProjectConfig, res FleetResult, waits [][]time.Duration, scale float64) Projection {
	p := Projection{Cores: cfg.Cores, Hosts: cfg.Hosts, Sandboxes: int(float64(cfg.Cores) * cfg.PerCore)}
	if len(res.Sizes) == 0 {
		return p
	}
	big := res.Sizes[0]
	for _, s := range res.Sizes {
		if s.Sandboxes > big.Sandboxes {
			big = s
		}
	}
	p.From = big.Sandboxes
	if cfg.TurnInterval > 0 {
		p.TurnInterval, p.IntervalFrom = cfg.TurnInterval.Seconds(), "given"
	} else {
		var wait time.Duration
		n := 0
		for _, w := range waits {
			for _, d := range w {
				wait += d
				n++
			}
		}
		var exec float64
		turns := 0
		for _, r := range res.Runs {
			if r.Mode == ModeNone {
				exec += r.ExecSeconds
				turns += r.Turns
			}
		}
		if n > 0 && scale > 0 && turns > 0 {
			p.TurnInterval = wait.Seconds()/float64(n)/scale + exec/float64(turns)
			p.IntervalFrom = fmt.Sprintf("the trajectories' LLM waits before scaling (mean of %d) plus the commands' mean time", n)
		}
	}
	if p.TurnInterval <= 0 {
		return p
	}
	p.TurnsPerS = float64(p.Sandboxes) / p.TurnInterval
	p.CPUCores = p.TurnsPerS * big.CPUPerTurnMS / 1000
	if p.Cores > 0 {
		p.CPUShare = p.CPUCores / float64(p.Cores)
	}
	p.DiskMBps = p.TurnsPerS * big.WrittenPerTurn / 1e6
	p.UploadMBps = p.TurnsPerS * big.UploadedPerTurn / 1e6
	p.StoreRPS = p.TurnsPerS * big.RequestsPerTurn
	h := float64(p.Hosts)
	p.FleetTurnsPerS = p.TurnsPerS * h
	p.FleetUploadGBps = p.UploadMBps * h / 1000
	p.FleetStoreRPS = p.StoreRPS * h
	return p
}

// PrintFleet prints the fleet benchmark's tables.
func PrintFleet(w io.Writer, r FleetResult) {
	fmt.Fprintf(w, "Store: %s. Each sandbox replays its trajectory (at most %d turns; LLM waits scaled by %.2f) in a fresh sandbox; none: no checkpoints, not watched; auto: EndTurn, checkpoints uploaded in the background.\n\n", r.Store, r.MaxTurns, r.LLMScale)
	fmt.Fprintf(w, "Store warm-up (not counted below): one sandbox's first turn uploaded %s in %d requests, in the store %.1f s after it.\n\n",
		mib1(r.Warmup.Uploaded), r.Warmup.StoreRequests, r.Warmup.DrainSeconds)
	fmt.Fprintf(w, "%9s  %4s  %5s  %7s  %6s  %8s  %15s  %15s  %8s  %9s  %9s  %8s  %9s  %9s\n",
		"sandboxes", "mode", "turns", "ckpts", "full", "time", "stall p50/p99", "turn end p50/p99", "cpu", "written", "uploaded", "requests", "drain", "behind")
	for _, x := range r.Runs {
		stall, end := "-", fmt.Sprintf("%.1f/%.1f ms", x.TurnEnd.P50, tailOf(x.TurnEnd))
		drain, behind := "-", "-"
		if x.Mode != ModeNone {
			stall = fmt.Sprintf("%.1f/%.1f ms", x.Stall.P50, tailOf(x.Stall))
			drain = fmt.Sprintf("%.1f s", x.DrainSeconds)
			behind = fmt.Sprintf("%d", x.NotInStore)
		}
		fmt.Fprintf(w, "%9d  %4s  %5d  %7d  %6d  %6.1f s  %15s  %15s  %6.1f s  %9s  %9s  %8d  %9s  %9s\n",
			x.Sandboxes, x.Mode, x.Turns, x.Checkpoints, x.Full, x.Seconds, stall, end, x.CPUSeconds,
			mib1(x.BytesWritten), mib1(x.Uploaded), x.StoreRequests, drain, behind)
	}
	fmt.Fprintf(w, "\nauto against none at each size (molt's cost: the host's CPU time auto minus none; per turn of the trajectories):\n")
	fmt.Fprintf(w, "%9s  %9s  %11s  %13s  %14s  %12s  %10s  %10s\n", "sandboxes", "overhead", "cpu/turn", "written/turn", "uploaded/turn", "requests/turn", "store rps", "upload MB/s")
	for _, s := range r.Sizes {
		fmt.Fprintf(w, "%9d  %+8.2f%%  %8.1f ms  %9.1f KiB  %10.1f KiB  %12.1f  %10.1f  %10.2f\n",
			s.Sandboxes, s.Overhead*100, s.CPUPerTurnMS, s.WrittenPerTurn/1024, s.UploadedPerTurn/1024, s.RequestsPerTurn, s.StoreRPS, s.UploadMBps)
	}
	p := r.Projection
	if p.TurnInterval <= 0 {
		return
	}
	fmt.Fprintf(w, "\nProjection from %d sandboxes' per-turn costs, a turn every %.1f s per sandbox (%s):\n", p.From, p.TurnInterval, p.IntervalFrom)
	fmt.Fprintf(w, "  a %d-core host with %d sandboxes: %.1f turns/s; molt %.2f cores (%.1f%%), disk %.1f MB/s, to the store %.1f MB/s in %.0f requests/s\n",
		p.Cores, p.Sandboxes, p.TurnsPerS, p.CPUCores, p.CPUShare*100, p.DiskMBps, p.UploadMBps, p.StoreRPS)
	fmt.Fprintf(w, "  %d such hosts: %.0f turns/s; to the store %.2f GB/s in %.0f requests/s\n", p.Hosts, p.FleetTurnsPerS, p.FleetUploadGBps, p.FleetStoreRPS)
}

func tailOf(s Stats) float64 {
	_, v := s.Tail()
	return v
}

func mib1(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
