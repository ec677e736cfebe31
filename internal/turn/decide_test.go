package turn

import (
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/inspect"
	"github.com/molt-sh/molt/internal/meta"
)

func TestIgnored(t *testing.T) {
	cases := []struct {
		pat, path string
		want      bool
	}{
		{"/tmp/**", "/tmp/a/b", true},
		{"/tmp/**", "/tmp", true},
		{"/tmp/**", "/tmpx/a", false},
		{"**/__pycache__/**", "/w/pkg/__pycache__/m.cpython-311.pyc", true},
		{"**/__pycache__/**", "/w/pkg/m.py", false},
		{"/var/log/*.log", "/var/log/x.log", true},
		{"/var/log/*.log", "/var/log/sub/x.log", false},
	}
	for _, c := range cases {
		if got := ignored(c.path, []string{c.pat}); got != c.want {
			t.Errorf("ignored(%q, %q) = %v, want %v", c.path, c.pat, got, c.want)
		}
	}
	for _, bad := range []string{"tmp/**", "/a/[", ""} {
		if validIgnore(bad) == nil {
			t.Errorf("validIgnore(%q) accepted", bad)
		}
	}
}

func TestDecide(t *testing.T) {
	file := func(p, fs string, ops ...string) inspect.FileEffect {
		return inspect.FileEffect{Path: p, FS: fs, Ops: ops}
	}
	cases := []struct {
		name string
		obs  observation
		want string
	}{
		{"nothing", observation{}, v1.DecisionNone},
		{"sockets and short processes only", observation{effects: inspect.Effects{
			Processes: []inspect.ProcEffect{{Op: "spawn", Pid: 9}, {Op: "exit", Pid: 9}},
			Sockets:   []inspect.SockEffect{{Op: "connect", Family: "inet"}},
		}}, v1.DecisionNone},
		{"file written", observation{effects: inspect.Effects{Files: []inspect.FileEffect{file("/w/a.py", "btrfs", "write")}}}, v1.DecisionFS},
		{"ignored file", observation{effects: inspect.Effects{Files: []inspect.FileEffect{file("/tmp/x", "btrfs", "write")}}}, v1.DecisionNone},
		{"unresolved path never ignored", observation{effects: inspect.Effects{Files: []inspect.FileEffect{file("?", "", "write")}}}, v1.DecisionFS},
		{"procfs write", observation{effects: inspect.Effects{Files: []inspect.FileEffect{file("/proc/self/oom_score_adj", "proc", "write")}}}, v1.DecisionFull},
		{"unknown", observation{effects: inspect.Effects{Unknown: []string{"mount"}}}, v1.DecisionFull},
		{"lost events", observation{effects: inspect.Effects{Lost: 3}}, v1.DecisionFull},
		{"long-lived ran", observation{longLived: []meta.LongLivedChange{{Pid: 5, Comm: "python3", Change: "ran"}}}, v1.DecisionFull},
		{"session changed", observation{sessChanges: []meta.SessionChange{{Name: "s", Change: "changed"}}}, v1.DecisionFull},
		{"forced", observation{force: []string{"no baseline"}}, v1.DecisionFull},
	}
	for _, c := range cases {
		got, reasons, _ := decide(c.obs, []string{"/tmp/**"})
		if got != c.want {
			t.Errorf("%s: decision %s (%v), want %s", c.name, got, reasons, c.want)
		}
		if got != v1.DecisionNone && len(reasons) == 0 {
			t.Errorf("%s: decision %s without a reason", c.name, got)
		}
	}
}
