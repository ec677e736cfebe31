package criu

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// DefaultPath is where scripts/criu.sh installs CRIU (a wrapper that runs
// the binary with its own libraries).
const DefaultPath = "/opt/molt/criu/bin/criu"

// DefaultTimeout bounds a CRIU call whose context has no deadline.
const DefaultTimeout = 5 * time.Minute

// Tool runs one CRIU binary. It is safe for concurrent use.
type Tool struct {
	path string

	probeMu sync.Mutex
	probed  *Features // +checklocks:probeMu

	featMu sync.Mutex
	feat   *featureSet // +checklocks:featMu

	kdatMu sync.Mutex
	// The cache /run/criu.kdat points at.
	kdatFile string // +checklocks:kdatMu
}

// New returns a Tool for the CRIU binary at path; "" means DefaultPath.
// Nothing is run until the first call.
func New(path string) *Tool {
	if path == "" {
		path = DefaultPath
	}
	return &Tool{path: path}
}

// Path returns the CRIU binary the Tool runs.
func (t *Tool) Path() string { return t.path }

// Error is a failed CRIU call.
type Error struct {
	Op    string // "dump", "restore", "lazy-pages", ...
	Cause string // the first real error of CRIU's log, or CRIU's own message
	Log   string // CRIU's log file, "" if there is none
	Err   error  // what failed at the Go side; may wrap an errdefs kind
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "criu %s: ", e.Op)
	switch {
	case e.Cause != "":
		b.WriteString(e.Cause)
	case e.Err != nil:
		b.WriteString(e.Err.Error())
	default:
		b.WriteString("failed")
	}
	if e.Log != "" {
		fmt.Fprintf(&b, " (log %s)", e.Log)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }
