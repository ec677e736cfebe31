package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestEveryCommandHasExample: every runnable command's help shows an
// example, and each example runs the command it belongs to (no example
// left behind under a renamed command).
func TestEveryCommandHasExample(t *testing.T) {
	root := newRootCmd()
	seen := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, s := range c.Commands() {
			walk(s)
		}
		if !c.Runnable() || c.Hidden || c.Name() == "help" || c.Parent() != nil && c.Parent().Name() == "completion" {
			return
		}
		seen[c.CommandPath()] = true
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("%s: no example in its help", c.CommandPath())
			return
		}
		for _, line := range strings.Split(c.Example, "\n") {
			line = strings.TrimSpace(line)
			if line != "" && !strings.Contains(line, c.CommandPath()) {
				t.Errorf("%s: example %q does not run it", c.CommandPath(), line)
			}
		}
	}
	walk(root)
	for path := range examples {
		if !seen[path] {
			t.Errorf("examples names %q, which is not a command", path)
		}
	}
}

func TestUsePlaceholders(t *testing.T) {
	for use, want := range map[string][]string{
		"rollback SANDBOX CHECKPOINT":                     {"SANDBOX", "CHECKPOINT"},
		"rm CHECKPOINT...":                                {"CHECKPOINT..."},
		"fork SANDBOX|CHECKPOINT":                         {"SANDBOX|CHECKPOINT"},
		"exec SANDBOX [--session S] [--detach] -- CMD...": {"SANDBOX"},
		"verify CHECKPOINT [--chain]":                     {"CHECKPOINT"},
		"ls":                                              nil,
		"import NAME PATH":                                {"NAME", "PATH"},
		"verify [FILE]":                                   nil,
		"consume EFFECT --by WHO":                         {"EFFECT"},
		"build name":                                      nil,
	} {
		if got := usePlaceholders(use); !reflect.DeepEqual(got, want) {
			t.Errorf("usePlaceholders(%q) = %q, want %q", use, got, want)
		}
	}
}
