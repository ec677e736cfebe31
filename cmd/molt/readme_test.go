package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestREADMEListsEveryFlag: README.md names every flag of every command
// (by its long or its short form), and the flags `molt bench` gives all
// its subcommands; each bench's own knobs are left to its --help.
func TestREADMEListsEveryFlag(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	named := func(f *pflag.Flag) bool {
		if regexp.MustCompile(`--` + regexp.QuoteMeta(f.Name) + `([^\w-]|$)`).MatchString(readme) {
			return true
		}
		return f.Shorthand != "" && regexp.MustCompile(`(^|[^\w-])-`+regexp.QuoteMeta(f.Shorthand)+`([^\w-]|$)`).MatchString(readme)
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		path := c.CommandPath()
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		flags := c.LocalNonPersistentFlags()
		if strings.HasPrefix(path, "molt bench ") {
			flags = pflag.NewFlagSet("", pflag.ContinueOnError) // its own --help
		}
		flags.AddFlagSet(c.PersistentFlags())
		flags.VisitAll(func(f *pflag.Flag) {
			if f.Name != "help" && f.Name != "version" && !f.Hidden && !named(f) {
				t.Errorf("README.md does not name %s --%s", path, f.Name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
}
