//go:build !(linux && amd64)

package template

import (
	"fmt"
	"runtime"

	"github.com/molt-sh/molt/internal/errdefs"
)

var errArch = fmt.Errorf("process templates on %s/%s: %w", runtime.GOOS, runtime.GOARCH, errdefs.ErrNotSupported)

// Tracer is unavailable on this platform: every call fails.
type Tracer struct{}

func NewTracer() *Tracer                                  { return &Tracer{} }
func (t *Tracer) Close()                                  {}
func (t *Tracer) Seize(pid int) error                     { return errArch }
func (t *Tracer) Clone(pid int, parent bool) (int, error) { return 0, errArch }
func (t *Tracer) Detach(copyPid int) error                { return errArch }
func (t *Tracer) Kill(copyPid int) error                  { return errArch }
func (t *Tracer) Protect(pid int) error                   { return errArch }
func (t *Tracer) Release(pid int) error                   { return errArch }

func ProtectFrozen(stop, protect []int, thaw, freeze func() error) error { return errArch }
