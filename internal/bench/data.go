package bench

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DefaultTrajectories is where the recorded trajectories live, relative
// to the repository's root: the project's shared data next to it.
const DefaultTrajectories = "../shared/data/trajectories/public.jsonl"

// moltModule is the module path that marks molt's repository root.
const moltModule = "github.com/molt-sh/molt"

// RepoRoot walks up from each start directory in turn to the first
// directory whose go.mod declares molt's module.
func RepoRoot(starts ...string) (string, error) {
	for _, s := range starts {
		if s == "" {
			continue
		}
		dir, err := filepath.Abs(s)
		if err != nil {
			continue
		}
		for {
			if isMoltModule(filepath.Join(dir, "go.mod")) {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("no molt repository (a go.mod of %s) above %s", moltModule, strings.Join(nonEmpty(starts), " or "))
}

func isMoltModule(gomod string) bool {
	f, err := os.Open(gomod)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if mod, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.TrimSpace(mod) == moltModule
		}
	}
	return false
}

func nonEmpty(v []string) []string {
	var out []string
	for _, s := range v {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// ResolveData finds rel (relative to the repository root) from the
// first of starts inside molt's repository, and checks it exists. The
// error says what was tried and that a flag can name the file.
func ResolveData(rel string, starts ...string) (string, error) {
	root, err := RepoRoot(starts...)
	if err != nil {
		return "", fmt.Errorf("cannot find the default data %s: %w; pass --data FILE", rel, err)
	}
	p := filepath.Clean(filepath.Join(root, rel))
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("default data %s (%s relative to the repository %s) does not exist; pass --data FILE", p, rel, root)
		}
		return "", err
	}
	return p, nil
}
