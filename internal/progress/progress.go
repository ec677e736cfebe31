// Package progress carries the progress of a long operation (an image
// build or import, a hibernation, a fork of many, a full checkpoint
// waited for) from the engine to whoever asked for it, through the
// operation's context: the API streams it to a client that asked for
// progress (docs/api.md, "Progress"), and anything else costs one
// context lookup.
//
// Reports are advisory: what reads them must not depend on their number
// or timing, and a sink may drop some (Throttle).
package progress

import (
	"bytes"
	"context"
	"io"
	"sync"
	"time"
)

// Step is where an operation stands.
type Step struct {
	// Message names the stage ("storing images", "fork 3 of 8").
	Message string
	// Done and Total measure the stage in Unit, when it can be
	// measured (Total > 0).
	Done, Total int64
	// Unit is "bytes", or empty for a count.
	Unit string
}

// Func receives reports; it must not block for long.
type Func func(Step)

type key struct{}

// With returns ctx carrying f: reports made under the returned context
// go to f.
func With(ctx context.Context, f Func) context.Context {
	return context.WithValue(ctx, key{}, f)
}

// Report tells ctx's receiver, if any, where the operation stands.
func Report(ctx context.Context, s Step) {
	if f, ok := ctx.Value(key{}).(Func); ok && f != nil {
		f(s)
	}
}

// Enabled reports whether anyone receives ctx's reports: work that
// exists only to measure progress (a count of bytes to come) can be
// skipped otherwise.
func Enabled(ctx context.Context) bool {
	f, ok := ctx.Value(key{}).(Func)
	return ok && f != nil
}

// Lines returns a writer that reports each line written to it (a
// tool's log, such as debootstrap's) as a Step's message, prefixed.
func Lines(ctx context.Context, prefix string) io.Writer {
	return &lineWriter{ctx: ctx, prefix: prefix}
}

type lineWriter struct {
	mu     sync.Mutex
	ctx    context.Context // +checklocks:mu
	prefix string          // +checklocks:mu
	buf    []byte          // +checklocks:mu
}

// maxLine bounds a line kept while its end has not come.
const maxLine = 4 << 10

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		if line := bytes.TrimRight(w.buf[:i], "\r"); len(line) > 0 {
			Report(w.ctx, Step{Message: w.prefix + string(line)})
		}
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > maxLine {
		w.buf = w.buf[:0]
	}
	return len(b), nil
}

// Reader counts the bytes read through r as a stage of total bytes
// (0: unknown), reported as they come (throttled by the receiver).
func Reader(ctx context.Context, r io.Reader, message string, total int64) io.Reader {
	if !Enabled(ctx) {
		return r
	}
	return &countReader{ctx: ctx, r: r, msg: message, total: total}
}

type countReader struct {
	ctx   context.Context
	r     io.Reader
	msg   string
	done  int64
	total int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.done += int64(n)
	if n > 0 || err == io.EOF {
		Report(c.ctx, Step{Message: c.msg, Done: c.done, Total: c.total, Unit: "bytes"})
	}
	return n, err
}

// Throttle returns a Func that passes reports on to f at most once per
// every, except a report of a new message or one that ends its stage
// (Done == Total), which pass at once. It is safe for concurrent use.
func Throttle(f Func, every time.Duration) Func {
	var mu sync.Mutex
	var last time.Time
	var msg string
	return func(s Step) {
		mu.Lock()
		now := time.Now()
		pass := s.Message != msg || (s.Total > 0 && s.Done >= s.Total) || now.Sub(last) >= every
		if pass {
			last, msg = now, s.Message
		}
		mu.Unlock()
		if pass {
			f(s)
		}
	}
}
