package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/progress"
)

// ndjson is the media type of a streamed answer (v1.Progress lines).
const ndjson = "application/x-ndjson"

// progressEvery bounds how often a stage's measured progress is sent.
const progressEvery = 200 * time.Millisecond

// wantsProgress reports whether the request asks for a streamed answer.
func wantsProgress(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		if t, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && t == ndjson {
			return true
		}
	}
	return false
}

// streamable serves h as it is unless the request asks for progress
// (Accept: application/x-ndjson): then the answer is a stream of
// v1.Progress lines, the engine's reports (internal/progress) as they
// come, and a last line holding what h answered, as Result or Error with
// its status. The stream's own status is 200: it starts before the
// outcome is known.
func streamable(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !wantsProgress(r) {
			h.ServeHTTP(w, r)
			return
		}
		// The server closes the body once the answer has begun. A JSON
		// body is read first (one byte past the bound is kept, so that the
		// handler refuses a body too large as ever); any other (a bundle's
		// tar stream) stays readable with the connection full duplex, or
		// the answer is not streamed.
		if t, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); t == "" || t == "application/json" {
			body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
			if err != nil {
				writeError(w, fmt.Errorf("read request body: %w: %w", err, errdefs.ErrInvalidArgument))
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		} else if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", ndjson)
		w.WriteHeader(http.StatusOK)
		f, _ := w.(http.Flusher)
		ps := &progressStream{enc: json.NewEncoder(w), f: f}
		if f != nil {
			f.Flush()
		}
		rec := &recorder{header: http.Header{}, status: http.StatusOK}
		ctx := progress.With(r.Context(), progress.Throttle(ps.report, progressEvery))
		h.ServeHTTP(rec, r.WithContext(ctx))
		setOutcome(w, rec.status, rec.body.Bytes())
		ps.finish(rec)
	})
}

// progressStream writes one streamed answer's lines.
type progressStream struct {
	mu   sync.Mutex
	enc  *json.Encoder // +checklocks:mu
	f    http.Flusher  // +checklocks:mu
	done bool          // +checklocks:mu
}

func (p *progressStream) report(s progress.Step) {
	p.write(v1.Progress{Message: s.Message, Done: s.Done, Total: s.Total, Unit: s.Unit}, false)
}

// write sends one line; none after the last (a report from work the
// operation left running).
func (p *progressStream) write(v v1.Progress, last bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	p.done = last
	_ = p.enc.Encode(v)
	if p.f != nil {
		p.f.Flush()
	}
}

// outcomeSetter is a response writer that records how a request ended
// (the audit log's recorder): a streamed answer's own status says
// nothing of it.
type outcomeSetter interface{ SetOutcome(code int, body []byte) }

// setOutcome tells the first writer down w's chain that records
// outcomes what the streamed answer's last line holds.
func setOutcome(w http.ResponseWriter, code int, body []byte) {
	for {
		if o, ok := w.(outcomeSetter); ok {
			o.SetOutcome(code, body)
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// finish sends the handler's answer as the last line.
func (p *progressStream) finish(rec *recorder) {
	body := bytes.TrimSpace(rec.body.Bytes())
	if rec.status/100 == 2 {
		if len(body) == 0 || !json.Valid(body) {
			body = []byte("null")
		}
		p.write(v1.Progress{Result: json.RawMessage(body), Status: rec.status}, true)
		return
	}
	var e v1.Error
	if json.Unmarshal(body, &e) != nil || e.Message == "" {
		e = v1.Error{Kind: v1.ErrKindInternal, Message: http.StatusText(rec.status) + ": " + string(body)}
	}
	p.write(v1.Progress{Error: &e, Status: rec.status}, true)
}

// recorder keeps a handler's answer for the stream's last line.
type recorder struct {
	header http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.status, r.wrote = code, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	if r.body.Len()+len(b) > maxStreamedAnswer {
		return 0, errAnswerTooLarge
	}
	return r.body.Write(b)
}

// maxStreamedAnswer bounds an answer held for a stream's last line (a
// fork of 1,000 sandboxes answers about 1 MiB).
const maxStreamedAnswer = 16 << 20

var errAnswerTooLarge = &answerTooLarge{}

type answerTooLarge struct{}

func (*answerTooLarge) Error() string { return "answer too large for a streamed reply" }
