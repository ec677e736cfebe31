// Printing the turns benchmark's result as tables, its targets checked.

package bench

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	v1 "github.com/molt-sh/molt/api/v1"
)

// PrintTurns writes the result as tables with the targets checked.
func PrintTurns(w io.Writer, r TurnsResult) {
	printTurnsWaits(w, r)
	printTurnsModes(w, r)
	printTurnsDecisions(w, r)
	printTurnsTargets(w, r)
	printTurnsParallel(w, r)
	fmt.Fprintf(w, "\nwhole run: %.1f s\n", r.Seconds)
}

// printTurnsWaits writes the simulated LLM waits per agent.
func printTurnsWaits(w io.Writer, r TurnsResult) {
	fmt.Fprintf(w, "LLM waits (simulated, scale %.3g; %.0f ms default where none is recorded, recorded waits capped at %.0f ms before scaling):\n",
		r.LLMScale, r.LLMWaitMS*r.LLMScale, r.LLMMaxMS)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "agent\ttrajectories\tturns\trecorded\tmean\tp50\tp90\tmax\ttotal\t")
	for _, wt := range r.Waits {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f ms\t%.0f ms\t%.0f ms\t%.0f ms\t%.1f s\t\n", wt.Agent, r.PerAgent[wt.Agent], wt.Turns, wt.Recorded, wt.MeanMS, wt.P50MS, wt.P90MS, wt.MaxMS, wt.TotalS)
	}
	tw.Flush()
}

// printTurnsModes writes the replay's totals per mode.
func printTurnsModes(w io.Writer, r TurnsResult) {
	fmt.Fprintf(w, "\nReplay per mode (each trajectory in a fresh sandbox per mode; command timeout %.0f ms", r.CmdTimeoutMS)
	if !r.FullWaits {
		fmt.Fprint(w, "; full without LLM waits")
	}
	fmt.Fprintln(w, "):")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tturns\trun\tkeystrokes\tno cmd\ttimed out\texit!=0\terrors\ttime\tcommands\tturn end p50 / tail\tover waits\tstall p50 / tail\tcheckpoints\tbytes written\tCRIU image bytes\t")
	for _, t := range r.Totals {
		end, stall, over := "-", "-", "-"
		if t.Mode != ModeNone {
			end = p50Tail(t.TurnEnd)
			stall = p50Tail(t.Stall)
			if t.Mode != ModeFull || r.FullWaits {
				over = fmt.Sprintf("%.2f s", t.Overrun)
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.1f s\t%.1f s\t%s\t%s\t%s\t%d\t%s\t%s\t\n", t.Mode, t.Turns, t.Executed, t.Inputs, t.NoCommand,
			t.TimedOut, t.Nonzero, t.Errors+t.EndErrors, t.Seconds, t.ExecSeconds, end, over, stall, t.Checkpoints, human(t.BytesWritten), human(t.ImageBytes))
	}
	tw.Flush()
}

// printTurnsDecisions writes auto's decisions per agent, what the
// inspector saw, and what made turns full or fs; nothing without auto.
func printTurnsDecisions(w io.Writer, r TurnsResult) {
	all := r.Decisions["all"]
	if len(all) == 0 {
		return
	}
	fmt.Fprintln(w, "\nDecisions under auto (turns, setup excluded):")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "agent\tturns\tnone\tfs\tfull\t")
	var agents []string
	for a := range r.Decisions {
		if a != "all" {
			agents = append(agents, a)
		}
	}
	sort.Strings(agents)
	for _, a := range append(agents, "all") {
		d := r.Decisions[a]
		n := d[v1.DecisionNone] + d[v1.DecisionFS] + d[v1.DecisionFull]
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%.1f%%\t%.1f%%\t\n", a, n, pct(d[v1.DecisionNone], n), pct(d[v1.DecisionFS], n), pct(d[v1.DecisionFull], n))
	}
	tw.Flush()
	e := r.Effects
	fmt.Fprintf(w, "\nWhat the inspector saw (auto, %d turns): files changed in %d turns (%d file effects, %d ignored), long-lived process changes in %d, session state changes in %d, unknown effects in %d, sockets (other than init's) in %d, processes spawned in %d.\n",
		e.Turns, e.WithFiles, e.FileEffects, e.IgnoredFiles, e.WithLongLived, e.WithSessions, e.WithUnknown, e.WithSockets, e.WithProcesses)
	nfull := all[v1.DecisionFull]
	if len(r.FullReasons) > 0 {
		fmt.Fprintf(w, "\nWhy turns were full (%d full turns; a turn may have several reasons; an example command):\n", nfull)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, c := range r.FullReasons {
			fmt.Fprintf(tw, "  %6d\t%5.1f%%\t%s\t%s\n", c.Turns, pct(c.Turns, nfull), c.What, c.Example)
		}
		tw.Flush()
		fmt.Fprintln(w, "\nWhat full turns ran (shell: program; otherwise the turn kind):")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, c := range r.FullCommands {
			fmt.Fprintf(tw, "  %6d\t%5.1f%%\t%s\t%s\n", c.Turns, pct(c.Turns, nfull), c.What, c.Example)
		}
		tw.Flush()
	}
	if len(r.FSCommands) > 0 {
		nfs := all[v1.DecisionFS]
		fmt.Fprintf(w, "\nWhat fs turns ran (%d fs turns):\n", nfs)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, c := range r.FSCommands {
			fmt.Fprintf(tw, "  %6d\t%5.1f%%\t%s\t%s\n", c.Turns, pct(c.Turns, nfs), c.What, c.Example)
		}
		tw.Flush()
	}
}

// printTurnsTargets writes the traffic reduction and the time overhead
// of auto, each next to its target.
func printTurnsTargets(w io.Writer, r TurnsResult) {
	var none, auto, full *TurnsModeTotals
	for i := range r.Totals {
		switch r.Totals[i].Mode {
		case ModeNone:
			none = &r.Totals[i]
		case ModeAuto:
			auto = &r.Totals[i]
		case ModeFull:
			full = &r.Totals[i]
		}
	}
	fmt.Fprintln(w)
	if auto != nil && full != nil && full.BytesWritten > 0 {
		fmt.Fprintf(w, "Checkpoint traffic: auto %s, full every turn %s (plain CRIU dumps: %s of images): reduction %.1f%% (target >= 87%%: %s); vs plain dumps %.1f%%\n",
			human(auto.BytesWritten), human(full.BytesWritten), human(full.ImageBytes), 100*r.TrafficReduction, verdict(r.TrafficReduction >= 0.87), 100*r.PlainReduction)
		fmt.Fprintf(w, "  of which the setup turns' checkpoints: auto %s, full %s; the trajectories' turns alone: auto %s, full %s: reduction %.1f%%\n",
			human(auto.SetupBytes), human(full.SetupBytes), human(auto.BytesWritten-auto.SetupBytes), human(full.BytesWritten-full.SetupBytes), 100*r.TurnsReduction)
	}
	if none != nil && auto != nil && none.Seconds > 0 {
		fmt.Fprintf(w, "Time: none %.1f s, auto %.1f s: overhead %+.2f%% (target <= 2%%: %s)", none.Seconds, auto.Seconds, 100*r.Overhead, verdict(r.Overhead <= 0.02))
		switch {
		case full != nil && r.FullWaits:
			fmt.Fprintf(w, "; full every turn %.1f s: %+.2f%%", full.Seconds, 100*r.FullOverhead)
		case full != nil:
			fmt.Fprint(w, "; full every turn replayed without LLM waits (its time is not comparable; --full-waits)")
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "  conditions: none runs without the inspector (its programs detached), the modes' order rotates per trajectory; LLM waits simulated at %.3g of the recorded ones; %d of %d commands exited non-zero or timed out in mode none (no repository in the sandboxes)\n",
			r.LLMScale, none.Nonzero+none.TimedOut, none.Executed)
		var agents []string
		for a := range r.AgentOverhead {
			agents = append(agents, a)
		}
		sort.Strings(agents)
		for _, a := range agents {
			fmt.Fprintf(w, "  %s: none %.1f s, auto %.1f s: %+.2f%%\n", a, none.AgentSeconds[a], auto.AgentSeconds[a], 100*r.AgentOverhead[a])
		}
	}
}

// printTurnsParallel writes the stalls of the sandboxes replaying at
// once, with and without the scheduler; nothing without that part.
func printTurnsParallel(w io.Writer, r TurnsResult) {
	if len(r.Parallel) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%d sandboxes replaying at once (%d trajectories each in turn; auto: as recorded, full: a full checkpoint after every turn, no LLM waits), checkpoint stall of the turns that checkpointed:\n", r.Parallel[0].Sandboxes, r.Parallel[0].Runs)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tscheduler\tturns\tcheckpoints\tfull\tstall p50\tstall tail\tfull stall p50\tfull stall tail\tturn end p50 / tail\tover waits\terrors\twall\t")
	for _, p := range r.Parallel {
		s := "on"
		if !p.Scheduler {
			s = "off"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.1f ms\t%s\t%.1f ms\t%s\t%s\t%.2f s\t%d\t%.1f s\t\n", p.Mode, s, p.Turns, p.Checkpoints, p.Full,
			p.Stall.P50, p.Stall.TailString(), p.FullStall.P50, p.FullStall.TailString(), p50Tail(p.TurnEnd), p.Overrun, p.Errors+p.EndErrors, p.Seconds)
	}
	tw.Flush()
}
