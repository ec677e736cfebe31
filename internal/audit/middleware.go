package audit

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"time"
)

type actorKey struct{}

// WithActor returns ctx carrying a (the daemon sets it per connection).
func WithActor(ctx context.Context, a Actor) context.Context {
	return context.WithValue(ctx, actorKey{}, a)
}

func actorFrom(ctx context.Context) *Actor {
	if a, ok := ctx.Value(actorKey{}).(Actor); ok {
		return &a
	}
	return nil
}

// Appender is what the middleware needs of a Log.
type Appender interface {
	Append(Entry) (Entry, error)
	AppendAsync(Entry) (Entry, error)
}

// Middleware logs every request next serves: who (the connection's
// Actor), the route pattern and the IDs in the path, the status, the
// error kind of a failure and the duration; never a body. The entry is
// appended once next returns, before the response's last bytes leave
// (a small response is still buffered then); a connection upgraded to a
// stream (exec) is logged when it is hijacked, with status 101. A request
// that can change something is on disk before its answer is complete;
// a GET or HEAD is written at once and synced by the group commit a few
// milliseconds later (Log.AppendAsync). A failed append is passed to
// onErr: the request has been served by then.
func Middleware(l Appender, next http.Handler, onErr func(error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &recorder{ResponseWriter: w, r: r, l: l, onErr: onErr, start: time.Now()}
		next.ServeHTTP(rec, r)
		if !rec.logged {
			rec.log(rec.status())
		}
	})
}

// recorder watches a response for its status and, for a failure, the
// error kind in the first bytes of its body.
type recorder struct {
	http.ResponseWriter
	r      *http.Request
	l      Appender
	onErr  func(error)
	start  time.Time
	code   int
	errBuf []byte
	logged bool
	// settled: SetOutcome said how the request ended; what is written
	// after is a stream's line, not an error body.
	settled bool
}

// maxErrPeek bounds what is kept of a failure's body to find its kind.
const maxErrPeek = 512

func (rec *recorder) WriteHeader(code int) {
	if rec.code == 0 {
		rec.code = code
	}
	rec.ResponseWriter.WriteHeader(code)
}

func (rec *recorder) Write(b []byte) (int, error) {
	if rec.code == 0 {
		rec.code = http.StatusOK
	}
	if rec.code >= 400 && !rec.settled && len(rec.errBuf) < maxErrPeek {
		rec.errBuf = append(rec.errBuf, b[:min(len(b), maxErrPeek-len(rec.errBuf))]...)
	}
	return rec.ResponseWriter.Write(b)
}

func (rec *recorder) Flush() {
	if f, ok := rec.ResponseWriter.(http.Flusher); ok {
		if rec.code == 0 {
			rec.code = http.StatusOK
		}
		f.Flush()
	}
}

func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := rec.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, http.ErrNotSupported
	}
	c, rw, err := hj.Hijack()
	if err == nil {
		rec.log(http.StatusSwitchingProtocols)
	}
	return c, rw, err
}

func (rec *recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }

// SetOutcome records the status and body of the answer a streamed
// response carries in its last line (its own status is 200 from the
// start: internal/httpapi, "Progress"), so the entry says how the
// request ended, not that a stream began.
func (rec *recorder) SetOutcome(code int, body []byte) {
	rec.code, rec.settled = code, true
	rec.errBuf = nil
	if code >= 400 {
		rec.errBuf = append(rec.errBuf, body[:min(len(body), maxErrPeek)]...)
	}
}

func (rec *recorder) status() int {
	if rec.code == 0 {
		return http.StatusOK
	}
	return rec.code
}

func (rec *recorder) log(code int) {
	rec.logged = true
	e := RequestEntry(rec.r, code)
	e.DurationUS = time.Since(rec.start).Microseconds()
	if code >= 400 {
		var body struct {
			Kind string `json:"kind"`
		}
		if json.Unmarshal(rec.errBuf, &body) == nil {
			e.Error = body.Kind
		}
		if e.Error == "" {
			e.Error = "http " + http.StatusText(code)
		}
	}
	add := rec.l.Append
	if m := rec.r.Method; m == http.MethodGet || m == http.MethodHead {
		add = rec.l.AppendAsync
	}
	if _, err := add(e); err != nil && rec.onErr != nil {
		rec.onErr(err)
	}
}

// RequestEntry describes r (matched by a ServeMux: its Pattern and path
// values) as an API entry with status code.
func RequestEntry(r *http.Request, code int) Entry {
	e := Entry{Kind: KindAPI, Actor: actorFrom(r.Context()), Route: r.Pattern, Status: code}
	if e.Route == "" {
		e.Route = r.Method
		e.Path = r.URL.Path
		return e
	}
	p := r.Pattern
	switch {
	case strings.Contains(p, "/sandboxes/{id}"):
		e.Sandbox = r.PathValue("id")
	case strings.Contains(p, "/checkpoints/{id}"):
		e.Checkpoint = r.PathValue("id")
	case strings.Contains(p, "/effects/{id}"):
		e.Effect = r.PathValue("id")
	}
	switch {
	case strings.Contains(p, "/images/{name}"):
		e.Image = r.PathValue("name")
	case strings.Contains(p, "/sessions/{name}"):
		e.Session = r.PathValue("name")
	}
	return e
}
