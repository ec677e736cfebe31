package netlab

import (
	"encoding/json"
	"io"
	"net/http"
	"sync"
)

// hold is one HoldPayments: the next POST /pay waits for release.
type hold struct {
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *hold) let() { h.once.Do(func() { close(h.release) }) }

// PayCount is the number of POST /pay requests the payment service has
// received (counted on arrival, before a hold).
func (l *Lab) PayCount() int64 { return l.pays.Load() }

// HoldPayments makes the next POST /pay wait, after it is counted and
// before it is answered, until release is called (or the lab closes, or
// its client goes away). arrived is closed when it got there. A later
// HoldPayments before any payment arrives replaces this one, releasing
// it. release may be called more than once.
func (l *Lab) HoldPayments() (arrived <-chan struct{}, release func()) {
	h := &hold{arrived: make(chan struct{}), release: make(chan struct{})}
	l.mu.Lock()
	if old := l.hold; old != nil {
		old.let()
	}
	l.hold = h
	l.mu.Unlock()
	return h.arrived, h.let
}

// Payment is what POST /pay answers.
type Payment struct {
	Payment  int64  `json:"payment"`  // this payment's number, 1, 2, ...
	Received string `json:"received"` // the request's body
}

func (l *Lab) payMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /pay", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
			return
		}
		n := l.pays.Add(1)
		l.mu.Lock()
		h := l.hold
		l.hold = nil
		l.mu.Unlock()
		if h != nil {
			close(h.arrived)
			select {
			case <-h.release:
			case <-l.done:
			case <-r.Context().Done():
				return
			}
		}
		writeJSON(w, Payment{Payment: n, Received: string(body)})
	})
	mux.HandleFunc("POST /refund", l.refund)
	mux.HandleFunc("POST /cancel", l.refund)
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]int64{"count": l.pays.Load()})
	})
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, helloBody) })
	mux.HandleFunc("/echo", echoHTTP)
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(b, '\n'))
}
