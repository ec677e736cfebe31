// Command molt is the molt CLI and daemon. `molt daemon` runs the host
// daemon; every other command is a client of its API.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/molt-sh/molt/internal/sbinit"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// The same binary is the sandbox's init: the daemon re-executes it.
	sbinit.RunIfInit()
	cmd := newRootCmd()
	if err := cmd.Execute(); err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "molt:", err)
		os.Exit(1)
	}
}

// exitError makes molt exit with a command's exit code, silently.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }
