// The recorded trajectories the turns benchmark replays: loading and
// selecting them, the command of each turn, the simulated LLM waits, and
// the classes reasons and commands are counted by.

package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Agents of the trajectory data.
const (
	AgentMini      = "mini-swe-agent"
	AgentOpenHands = "openhands-codeact"
	AgentSWE       = "swe-agent"
)

// Trajectory is one recorded agent run (see the data's README).
type Trajectory struct {
	Agent  string           `json:"agent"`
	TaskID string           `json:"task_id"`
	Turns  []TrajectoryTurn `json:"turns"`
}

// TrajectoryTurn is one recorded agent action.
type TrajectoryTurn struct {
	I               int      `json:"i"`
	Kind            string   `json:"kind"`
	Command         *string  `json:"command"`
	TS              *float64 `json:"ts"`
	TimedOut        bool     `json:"timed_out"`
	ExecTimeS       *float64 `json:"exec_time_s"`
	ShellEquivalent *string  `json:"shell_equivalent"`
	IsInput         bool     `json:"is_input"`
}

// LoadTrajectories reads a JSONL file of trajectories.
func LoadTrajectories(path string) ([]Trajectory, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Trajectory
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var t Trajectory
		if err := json.Unmarshal(sc.Bytes(), &t); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		out = append(out, t)
	}
	return out, sc.Err()
}

// SelectTrajectories returns a deterministic sample of n trajectories,
// stratified by agent: the first ones of each agent in file order, as
// evenly as the agents' counts allow (an agent with fewer trajectories
// than its share gives the rest to the others). The result is
// interleaved by agent. all (or n >= len(ts)) selects everything.
func SelectTrajectories(ts []Trajectory, n int, all bool) []Trajectory {
	var agents []string
	by := map[string][]Trajectory{}
	for _, t := range ts {
		if _, ok := by[t.Agent]; !ok {
			agents = append(agents, t.Agent)
		}
		by[t.Agent] = append(by[t.Agent], t)
	}
	take := map[string]int{}
	if all || n >= len(ts) {
		for _, a := range agents {
			take[a] = len(by[a])
		}
	} else {
		// Water-filling: one more for each agent that still has some,
		// round by round.
		for left := n; left > 0; {
			progress := false
			for _, a := range agents {
				if left > 0 && take[a] < len(by[a]) {
					take[a]++
					left--
					progress = true
				}
			}
			if !progress {
				break
			}
		}
	}
	var out []Trajectory
	for i := 0; ; i++ {
		more := false
		for _, a := range agents {
			if i < take[a] {
				out = append(out, by[a][i])
				more = true
			}
		}
		if !more {
			return out
		}
	}
}

var workspaceDirRE = regexp.MustCompile(`/workspace/([A-Za-z0-9_.-]+__[A-Za-z0-9_.-]+__[0-9][A-Za-z0-9_.-]*)`)

// WorkspaceDirs returns the repository directories
// (/workspace/<org>__<repo>__<version>) the trajectory's commands name,
// sorted.
func WorkspaceDirs(t Trajectory) []string {
	seen := map[string]bool{}
	for _, tu := range t.Turns {
		for _, cmd := range []*string{tu.Command, tu.ShellEquivalent} {
			if cmd == nil {
				continue
			}
			for _, m := range workspaceDirRE.FindAllStringSubmatch(*cmd, -1) {
				seen["/workspace/"+strings.TrimRight(m[1], ".")] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for d := range seen {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// TurnCommand returns the shell text to replay for a turn and whether
// anything runs: nothing for a turn without a command, and nothing for
// an OpenHands keystroke turn (is_input: input to a running process, not
// a new command). SWE-agent turns run their plain-shell rendering when
// they have one.
func TurnCommand(agent string, tu TrajectoryTurn) (string, bool) {
	if tu.IsInput {
		return "", false
	}
	if agent == AgentSWE && tu.ShellEquivalent != nil {
		return *tu.ShellEquivalent, true
	}
	if tu.Command == nil {
		return "", false
	}
	return *tu.Command, true
}

// WaitConfig says how LLM waits are simulated.
type WaitConfig struct {
	// Scale multiplies every wait (recorded or default).
	Scale float64
	// Default is the wait (before scaling) of turns without a recording.
	Default time.Duration
	// Max caps a recorded wait (before scaling); 0: no cap.
	Max time.Duration
}

// miniTimeout is mini-swe-agent's recorded command timeout: a turn
// recorded as timed out took this long.
const miniTimeout = 60 * time.Second

// RecordedGap returns the recorded time between the LLM responses that
// produced turns i-1 and i (mini-swe-agent's ts), and whether there is
// one.
func RecordedGap(t Trajectory, i int) (time.Duration, bool) {
	if i <= 0 || i >= len(t.Turns) || t.Turns[i].TS == nil || t.Turns[i-1].TS == nil {
		return 0, false
	}
	return time.Duration((*t.Turns[i].TS - *t.Turns[i-1].TS) * float64(time.Second)), true
}

// LLMWait returns the simulated LLM wait before turn i: the recorded gap
// less the previous command's execution time (the recorded timeout when
// it timed out, else prevExec as measured in the replay), at least 0, at
// most cfg.Max, scaled; or the scaled default when nothing is recorded.
// recorded reports which.
func LLMWait(t Trajectory, i int, prevExec time.Duration, cfg WaitConfig) (wait time.Duration, recorded bool) {
	gap, ok := RecordedGap(t, i)
	if !ok {
		return time.Duration(float64(cfg.Default) * cfg.Scale), false
	}
	if t.Turns[i-1].TimedOut {
		prevExec = miniTimeout
	}
	w := max(0, gap-prevExec)
	if cfg.Max > 0 {
		w = min(w, cfg.Max)
	}
	return time.Duration(float64(w) * cfg.Scale), true
}

var (
	digitsRE    = regexp.MustCompile(`[0-9]+`)
	longLivedRE = regexp.MustCompile(`^long-lived process (.*) \([0-9]+\) (\w+)$`)
	sessionRE   = regexp.MustCompile(`^session (\S+) (\w+)$`)
	fileRE      = regexp.MustCompile(`^(\S+) of (\S+) on (\S+)$`)
	stepRE      = regexp.MustCompile(`&&|\|\||;|\n|\|`)
	assignRE    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
)

// NormalizeReason maps a turn decision's reason to a class, so reasons
// can be counted: PIDs, numbers and deep path elements go.
func NormalizeReason(r string) string {
	if m := longLivedRE.FindStringSubmatch(r); m != nil {
		return "long-lived process " + m[1] + " " + m[2]
	}
	if m := sessionRE.FindStringSubmatch(r); m != nil {
		return "session " + m[2]
	}
	if m := fileRE.FindStringSubmatch(r); m != nil {
		p := strings.Split(strings.Trim(m[2], "/"), "/")
		short := "/" + strings.Join(p[:min(2, len(p))], "/")
		if len(p) > 2 {
			short += "/..."
		}
		return m[1] + " of " + digitsRE.ReplaceAllString(short, "N") + " on " + m[3]
	}
	r = digitsRE.ReplaceAllString(r, "N")
	if i := strings.Index(r, ": "); i >= 0 && strings.HasPrefix(r, "unknown effect: ") {
		// Keep the effect's kind, drop its details.
		if j := strings.Index(r[i+2:], ": "); j >= 0 {
			r = r[:i+2+j]
		}
	}
	if len(r) > 80 {
		r = r[:77] + "..."
	}
	return r
}

// CommandProgram names what a shell command runs, for counting: the
// first word of its first step that is not a cd, an export, a source or
// a variable assignment (or "cd" etc. when that is all there is).
func CommandProgram(cmd string) string {
	steps := stepRE.Split(cmd, -1)
	first := ""
	for _, s := range steps {
		f := strings.Fields(strings.TrimLeft(strings.TrimSpace(s), "({"))
		for len(f) > 0 && assignRE.MatchString(f[0]) {
			f = f[1:]
		}
		if len(f) == 0 {
			continue
		}
		w := strings.TrimRight(f[0], ")}")
		if i := strings.LastIndex(w, "/"); i >= 0 && i < len(w)-1 {
			w = w[i+1:]
		}
		if first == "" {
			first = w
		}
		switch w {
		case "cd", "export", "source", ".", "set", "pushd", "popd", "true":
			continue
		}
		return w
	}
	if first == "" {
		return "(empty)"
	}
	return first
}
