// The recovery benchmark's accounting: when a restarted agent was back
// at its crash turn, the tallies per strategy and agent, and the report.

package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

func readEvents(p string) ([]AgentEvent, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var out []AgentEvent
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l == "" {
			continue
		}
		var e AgentEvent
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			return out, fmt.Errorf("events: %w", err)
		}
		out = append(out, e)
	}
	return out, nil
}

// BackAtCrash returns when a restarted agent was back at crash turn
// crash, and the bytes it replayed to get there: a chat-history agent
// once its chat is loaded and its commands re-run (their output); a
// fresh agent once it redid the crash turn's command (or got the crash
// turn's reply, for a turn without one), counting every LLM reply and
// command output up to there.
func BackAtCrash(evs []AgentEvent, crash int, mode string) (time.Time, int64, bool) {
	var n int64
	for _, e := range evs {
		switch {
		case mode == AgentChat && e.Phase == EvRerun:
			n += e.Bytes
		case mode == AgentChat && e.Phase == EvResumed:
			return time.Unix(0, e.T), n, true
		case mode != AgentChat && (e.Phase == EvLLM || e.Phase == EvExec) && e.Turn <= crash:
			n += e.Bytes
			if e.Phase == EvExec && e.Turn == crash {
				return time.Unix(0, e.T), n, true
			}
		case mode != AgentChat && e.Phase == EvLLM && e.Turn == crash+1:
			// The crash turn had no command.
			return time.Unix(0, e.T), n, true
		}
	}
	return time.Time{}, n, false
}

// TallyRecovery sums attempts per strategy and agent, and per strategy
// over every agent ("all").
func TallyRecovery(atts []RecoveryAttempt, strategies []string) []RecoveryTally {
	var out []RecoveryTally
	agents := []string{AgentMini, AgentOpenHands, AgentSWE, "all"}
	for _, s := range strategies {
		for _, ag := range agents {
			t := RecoveryTally{Strategy: s, Agent: ag}
			var times Sample
			var bytes []float64
			for _, a := range atts {
				if a.Strategy != s || (ag != "all" && a.Agent != ag) {
					continue
				}
				t.Attempts++
				if a.Correct {
					t.Correct++
				}
				t.Dups += a.Dups
				t.Missing += a.Missing
				t.Bytes += a.BytesReplayed
				bytes = append(bytes, float64(a.BytesReplayed))
				if a.Error != "" {
					t.Errors++
					continue
				}
				times = append(times, time.Duration(a.RecoverMS*float64(time.Millisecond)))
			}
			if t.Attempts == 0 {
				continue
			}
			if len(times) > 0 {
				t.Recover = times.Stats()
			}
			t.BytesMedian = int64(median(bytes))
			out = append(out, t)
		}
	}
	return out
}

// PrintRecovery writes the tallies, the volatile paths and what went
// wrong.
func PrintRecovery(w io.Writer, r RecoveryResult) {
	fmt.Fprintf(w, "\n%-11s %-18s %9s %8s %8s %7s %22s %16s\n", "strategy", "agent", "correct", "dup eff", "missing", "errors", "recover p50 / max", "bytes replayed")
	for _, t := range r.Tallies {
		rec := "-"
		if t.Recover.N > 0 {
			rec = fmt.Sprintf("%.0f / %.0f ms", t.Recover.P50, t.Recover.Max)
		}
		fmt.Fprintf(w, "%-11s %-18s %4d/%-4d %8d %8d %7d %22s %16s\n", t.Strategy, t.Agent, t.Correct, t.Attempts, t.Dups, t.Missing, t.Errors, rec,
			human(t.Bytes)+" ("+human(t.BytesMedian)+")")
	}
	fmt.Fprintln(w, "\ncorrect: the final file tree, session shell state, long-lived processes and payments equal a fault-free run's;")
	fmt.Fprintln(w, "recover: crash to the agent back at the crash turn; bytes replayed: total (median per attempt) of command output")
	fmt.Fprintln(w, "re-run or replayed and LLM replies re-requested until then.")
	fmt.Fprintf(w, "volatile (excluded everywhere): %s\n", strings.Join(r.Volatile, " "))
	vol := map[string]int{}
	for _, ref := range r.Refs {
		for _, p := range ref.Volatile {
			vol[p]++
		}
		if ref.Error != "" {
			fmt.Fprintf(w, "trajectory %d (%s %s): reference failed: %s\n", ref.Index, ref.Agent, ref.Task, ref.Error)
		}
		if ref.SessionsVary || ref.ProcessesVary {
			fmt.Fprintf(w, "trajectory %d: fault-free runs differ in sessions %v, processes %v (not compared)\n", ref.Index, ref.SessionsVary, ref.ProcessesVary)
		}
	}
	if len(vol) > 0 {
		var ps []string
		for _, p := range sortedKeys(vol) {
			ps = append(ps, fmt.Sprintf("%s (%d)", p, vol[p]))
		}
		fmt.Fprintf(w, "volatile (two fault-free runs differed; excluded for that trajectory): %s\n", strings.Join(ps, ", "))
	}
	for _, a := range r.Attempts {
		if a.Correct {
			continue
		}
		why := a.Error
		if why == "" {
			why = strings.Join(a.Diffs, "; ")
		}
		fmt.Fprintf(w, "incorrect: %s t%02d (%s) crash %s after turn %d: %s\n", a.Strategy, a.Traj, a.Agent, a.Crash.Kind, a.Crash.Turn, shorten(why, 300))
	}
}
