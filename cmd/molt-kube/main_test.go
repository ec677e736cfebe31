package main

import (
	"os"
	"regexp"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestREADMEListsEveryFlag: README.md names every flag of molt-kube.
func TestREADMEListsEveryFlag(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		flags := c.LocalNonPersistentFlags()
		flags.AddFlagSet(c.PersistentFlags())
		flags.VisitAll(func(f *pflag.Flag) {
			if f.Name != "help" && !regexp.MustCompile(`--`+regexp.QuoteMeta(f.Name)+`([^\w-]|$)`).Match(b) {
				t.Errorf("README.md does not name %s --%s", c.CommandPath(), f.Name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
}

// The agent refuses to start without a node name or with a capacity out
// of range, before it reaches any cluster.
func TestAgentFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	for _, args := range [][]string{{"agent"}, {"agent", "--node", "n1", "--capacity", "-1"}} {
		cmd := newRootCmd()
		cmd.SetArgs(args)
		cmd.SetOut(os.Stderr)
		if err := cmd.Execute(); err == nil {
			t.Errorf("molt-kube %v: no error", args)
		}
	}
}
