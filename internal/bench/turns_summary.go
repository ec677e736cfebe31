// Summing the turns benchmark's runs up: totals per mode, decisions and
// effects under auto, what made turns full, and the ratios.

package bench

import (
	"sort"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
)

// summarize fills the totals, decisions, effects and ratios.
func summarize(res *TurnsResult, waits [][]time.Duration, cfg TurnsConfig) {
	res.Waits = summarizeWaits(waits, cfg)
	totals := map[string]*TurnsModeTotals{}
	stalls := map[string]Sample{}
	ends := map[string]Sample{}
	res.Decisions = map[string]map[string]int{"all": {}}
	classes := newTurnClasses()
	for _, run := range res.Runs {
		t := totals[run.Mode]
		if t == nil {
			t = &TurnsModeTotals{Mode: run.Mode, AgentSeconds: map[string]float64{}}
			totals[run.Mode] = t
		}
		t.add(run)
		for _, s := range run.stalls {
			stalls[run.Mode] = append(stalls[run.Mode], msDur(s))
		}
		for _, o := range run.turns {
			if o.err == nil {
				ends[run.Mode] = append(ends[run.Mode], o.d)
			}
		}
		if run.Mode != ModeAuto {
			continue
		}
		if res.Decisions[run.Agent] == nil {
			res.Decisions[run.Agent] = map[string]int{}
		}
		for _, o := range run.turns {
			if o.err != nil {
				continue
			}
			d := o.res.Decision
			res.Decisions[run.Agent][d]++
			res.Decisions["all"][d]++
			res.Effects.add(o.res.Effects)
			classes.count(o)
		}
	}
	for _, m := range cfg.Modes {
		if t := totals[m]; t != nil {
			t.Stall, t.TurnEnd = stalls[m].Stats(), ends[m].Stats()
			res.Totals = append(res.Totals, *t)
		}
	}
	res.FullReasons, res.FullCommands, res.FSCommands = classes.top()
	summarizeRatios(res, totals[ModeNone], totals[ModeAuto], totals[ModeFull])
}

// summarizeWaits describes the simulated LLM waits per agent, agents in
// name order.
func summarizeWaits(waits [][]time.Duration, cfg TurnsConfig) []TurnsWaits {
	wby := map[string]Sample{}
	recBy := map[string]int{}
	var agents []string
	for i, t := range cfg.Trajectories {
		if _, ok := wby[t.Agent]; !ok {
			agents = append(agents, t.Agent)
		}
		wby[t.Agent] = append(wby[t.Agent], waits[i]...)
		for j := range waits[i] {
			if _, ok := RecordedGap(t, j); ok {
				recBy[t.Agent]++
			}
		}
	}
	sort.Strings(agents)
	var out []TurnsWaits
	for _, a := range agents {
		s := wby[a]
		var tot time.Duration
		for _, w := range s {
			tot += w
		}
		st := s.Stats()
		mean := 0.0
		if len(s) > 0 {
			mean = ms(tot) / float64(len(s))
		}
		out = append(out, TurnsWaits{Agent: a, Turns: len(s), Recorded: recBy[a], MeanMS: mean,
			P50MS: st.P50, P90MS: ms(s.Quantile(0.9)), MaxMS: ms(s.Quantile(1)), TotalS: tot.Seconds()})
	}
	return out
}

// add sums a run of the totals' mode into them (the stall and turn end
// statistics are computed from all runs at the end).
func (t *TurnsModeTotals) add(run TurnsRun) {
	t.Trajectories++
	t.Turns += run.Turns
	t.Executed += run.Executed
	t.Inputs += run.Inputs
	t.NoCommand += run.NoCommand
	t.TimedOut += run.TimedOut
	t.Nonzero += run.Nonzero
	t.Errors += run.Errors
	t.EndErrors += run.EndErrors
	t.Seconds += run.Seconds
	t.WaitSeconds += run.WaitSeconds
	t.ExecSeconds += run.ExecSeconds
	t.EndSeconds += run.EndSeconds
	t.Overrun += run.OverrunSeconds
	t.AgentSeconds[run.Agent] += run.Seconds
	t.Checkpoints += run.Checkpoints
	t.BytesWritten += run.BytesWritten
	t.SetupBytes += run.SetupBytes
	t.ImageBytes += run.ImageBytes
	t.Lost += run.Lost
}

// add counts what the inspector saw in one turn.
func (ef *TurnsEffects) add(e v1.TurnEffects) {
	ef.Turns++
	ef.FileEffects += len(e.Files)
	ef.IgnoredFiles += e.IgnoredFiles
	if len(e.Files) > 0 {
		ef.WithFiles++
	}
	if len(e.LongLived) > 0 {
		ef.WithLongLived++
	}
	if len(e.Sessions) > 0 {
		ef.WithSessions++
	}
	if len(e.Unknown) > 0 {
		ef.WithUnknown++
	}
	for _, so := range e.Sockets {
		// init accepting molt's own calls is not the agent's.
		if so.Addr != "@molt-init" {
			ef.WithSockets++
			break
		}
	}
	if len(e.Processes) > 0 {
		ef.WithProcesses++
	}
}

// turnClasses counts auto's checkpointing turns by class: the
// normalized reasons of full turns, and what full and fs turns ran, with
// the first command seen of each class as its example.
type turnClasses struct {
	reasons, fullCmds, fsCmds map[string]int
	examples                  map[string]string
}

func newTurnClasses() *turnClasses {
	return &turnClasses{reasons: map[string]int{}, fullCmds: map[string]int{}, fsCmds: map[string]int{}, examples: map[string]string{}}
}

// example keeps cmd as the example of class k unless it has one.
func (c *turnClasses) example(k, cmd string) {
	if _, ok := c.examples[k]; !ok && cmd != "" {
		c.examples[k] = cmd
	}
}

// count counts one ended turn of mode auto.
func (c *turnClasses) count(o turnOutcome) {
	label := o.kind
	if o.kind == "shell" || strings.HasPrefix(o.program, "(") {
		label = o.program
	}
	switch o.res.Decision {
	case v1.DecisionFull:
		seen := map[string]bool{}
		for _, r := range o.res.Reasons {
			seen[NormalizeReason(r)] = true
		}
		for r := range seen {
			c.reasons[r]++
			c.example("reason:"+r, o.cmd)
		}
		c.fullCmds[label]++
		c.example("full:"+label, o.cmd)
	case v1.DecisionFS:
		c.fsCmds[label]++
		c.example("fs:"+label, o.cmd)
	}
}

// top returns the most frequent classes with their examples: reasons of
// full turns, what full turns ran, what fs turns ran.
func (c *turnClasses) top() (reasons, fullCmds, fsCmds []TurnsCount) {
	reasons, fullCmds, fsCmds = topCounts(c.reasons, 12), topCounts(c.fullCmds, 12), topCounts(c.fsCmds, 8)
	for _, l := range []struct {
		prefix string
		counts []TurnsCount
	}{{"reason:", reasons}, {"full:", fullCmds}, {"fs:", fsCmds}} {
		for i := range l.counts {
			l.counts[i].Example = c.examples[l.prefix+l.counts[i].What]
		}
	}
	return reasons, fullCmds, fsCmds
}

// summarizeRatios computes auto's traffic reductions against full every
// turn and plain dumps, and the time overheads against none; a mode not
// replayed is nil.
func summarizeRatios(res *TurnsResult, none, auto, full *TurnsModeTotals) {
	if auto != nil && full != nil && full.BytesWritten > 0 {
		res.TrafficReduction = 1 - float64(auto.BytesWritten)/float64(full.BytesWritten)
		if full.ImageBytes > 0 {
			res.PlainReduction = 1 - float64(auto.BytesWritten)/float64(full.ImageBytes)
		}
		if f := full.BytesWritten - full.SetupBytes; f > 0 {
			res.TurnsReduction = 1 - float64(auto.BytesWritten-auto.SetupBytes)/float64(f)
		}
	}
	if none != nil && none.Seconds > 0 {
		if auto != nil {
			res.Overhead = (auto.Seconds - none.Seconds) / none.Seconds
			res.AgentOverhead = map[string]float64{}
			for a, s := range none.AgentSeconds {
				if s > 0 {
					res.AgentOverhead[a] = (auto.AgentSeconds[a] - s) / s
				}
			}
		}
		if full != nil {
			res.FullOverhead = (full.Seconds - none.Seconds) / none.Seconds
		}
	}
}

// topCounts is the n largest counts of m, ties in name order.
func topCounts(m map[string]int, n int) []TurnsCount {
	out := make([]TurnsCount, 0, len(m))
	for k, v := range m {
		out = append(out, TurnsCount{What: k, Turns: v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Turns != out[j].Turns {
			return out[i].Turns > out[j].Turns
		}
		return out[i].What < out[j].What
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// pct is a as a percentage of b, 0 when b is.
func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}
