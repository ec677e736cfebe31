package turn

import (
	"fmt"
	"path"
	"slices"
	"strings"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/inspect"
	"github.com/molt-sh/molt/internal/meta"
)

// observation is what a turn did, before the decision.
type observation struct {
	effects     inspect.Effects
	force       []string
	procs       map[int]procInfo
	sessions    map[string]string
	sessionPids map[int]bool
	longLived   []meta.LongLivedChange
	sessChanges []meta.SessionChange
}

// decide classifies an observation.
func decide(obs observation, ignore []string) (string, []string, meta.TurnEffects) {
	var eff meta.TurnEffects
	reasons := append([]string(nil), obs.force...)
	full := len(reasons) > 0
	files := 0
	for _, f := range obs.effects.Files {
		if !strings.HasPrefix(f.Path, "?") && ignored(f.Path, ignore) {
			eff.IgnoredFiles++
			continue
		}
		eff.Files = append(eff.Files, meta.FileEffect{Path: f.Path, Ops: f.Ops, FS: f.FS})
		switch f.FS {
		case "", "btrfs":
			files++
		default:
			// Not on the root filesystem: kernel or process state
			// (procfs, a tmpfs the sandbox mounted) that only a full
			// checkpoint holds.
			full = true
			reasons = append(reasons, fmt.Sprintf("%s of %s on %s", strings.Join(f.Ops, ","), f.Path, f.FS))
		}
	}
	for _, p := range obs.effects.Processes {
		eff.Processes = append(eff.Processes, meta.ProcessEffect{Op: p.Op, Pid: p.Pid, PPid: p.PPid, Comm: p.Comm, Path: p.Path})
	}
	for _, s := range obs.effects.Sockets {
		eff.Sockets = append(eff.Sockets, meta.SocketEffect{Op: s.Op, Pid: s.Pid, Family: s.Family, Addr: s.Addr})
	}
	eff.Unknown = append(eff.Unknown, obs.effects.Unknown...)
	if obs.effects.Lost > 0 {
		eff.Unknown = append(eff.Unknown, fmt.Sprintf("%d inspector events lost", obs.effects.Lost))
	}
	for _, u := range eff.Unknown {
		full = true
		reasons = append(reasons, "unknown effect: "+u)
	}
	eff.LongLived, eff.Sessions = obs.longLived, obs.sessChanges
	for _, c := range obs.longLived {
		full = true
		reasons = append(reasons, fmt.Sprintf("long-lived process %s (%d) %s", c.Comm, c.Pid, c.Change))
	}
	for _, c := range obs.sessChanges {
		full = true
		reasons = append(reasons, fmt.Sprintf("session %s %s", c.Name, c.Change))
	}
	switch {
	case full:
		return v1.DecisionFull, reasons, eff
	case files > 0:
		what := "files"
		if files == 1 {
			what = "file"
		}
		return v1.DecisionFS, []string{fmt.Sprintf("%d %s changed", files, what)}, eff
	}
	return v1.DecisionNone, []string{}, eff
}

// ValidIgnore checks ignore patterns (see validIgnore); a bad one is an
// invalid argument.
func ValidIgnore(patterns []string) error {
	for _, p := range patterns {
		if err := validIgnore(p); err != nil {
			return err
		}
	}
	return nil
}

// validIgnore checks an ignore pattern: an absolute path pattern (path.Match
// syntax per element), where a final or leading "**" element matches any
// number of elements.
func validIgnore(p string) error {
	if !strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "**/") {
		return fmt.Errorf("ignore pattern %q: want an absolute path pattern (as /tmp/** or **/__pycache__/**): %w", p, errdefs.ErrInvalidArgument)
	}
	if _, err := path.Match(strings.ReplaceAll(p, "**", "x"), ""); err != nil {
		return fmt.Errorf("ignore pattern %q: %v: %w", p, err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ignored reports whether p matches a pattern of ignore.
func ignored(p string, ignore []string) bool {
	for _, pat := range ignore {
		if matchPath(strings.Split(strings.Trim(pat, "/"), "/"), strings.Split(strings.Trim(p, "/"), "/")) {
			return true
		}
	}
	return false
}

func matchPath(pat, p []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			rest := pat[1:]
			for i := 0; i <= len(p); i++ {
				if matchPath(rest, p[i:]) {
					return true
				}
			}
			return false
		}
		if len(p) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], p[0]); !ok {
			return false
		}
		pat, p = pat[1:], p[1:]
	}
	return len(p) == 0
}

// mergeEffects returns a's effects followed by b's, files merged by path.
func mergeEffects(a, b inspect.Effects) inspect.Effects {
	out := inspect.Effects{Lost: a.Lost + b.Lost}
	idx := map[string]int{}
	for _, f := range append(append([]inspect.FileEffect(nil), a.Files...), b.Files...) {
		i, ok := idx[f.Path]
		if !ok {
			idx[f.Path] = len(out.Files)
			out.Files = append(out.Files, inspect.FileEffect{Path: f.Path, FS: f.FS, Ops: append([]string(nil), f.Ops...)})
			continue
		}
		for _, op := range f.Ops {
			if !slices.Contains(out.Files[i].Ops, op) {
				out.Files[i].Ops = append(out.Files[i].Ops, op)
			}
		}
		if out.Files[i].FS == "" {
			out.Files[i].FS = f.FS
		}
	}
	out.Processes = append(append(out.Processes, a.Processes...), b.Processes...)
	out.Sockets = append(append(out.Sockets, a.Sockets...), b.Sockets...)
	for _, u := range append(append([]string(nil), a.Unknown...), b.Unknown...) {
		if !slices.Contains(out.Unknown, u) {
			out.Unknown = append(out.Unknown, u)
		}
	}
	return out
}
