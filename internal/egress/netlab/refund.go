package netlab

import (
	"io"
	"net/http"
	"strings"
	"sync"
)

// The payment service's refunds (POST /refund, POST /cancel): what
// compensators send. A refund with an Idempotency-Key is applied once
// per key, as real payment services do; its later requests are answered
// as the first was. The lab keeps, per key, how many requests came and
// how many were applied, and the order in which refunds were applied.

// refunds is the refund side of the payment service.
type refunds struct {
	mu       sync.Mutex
	received map[string]int // +checklocks:mu
	applied  map[string]int // +checklocks:mu
	order    []Refund       // +checklocks:mu
	holds    []*hold        // +checklocks:mu
	fails    []refundFail   // +checklocks:mu
}

// Refund is one applied refund.
type Refund struct {
	Key  string // Idempotency-Key ("" without one)
	Path string // /refund or /cancel
	Body string
}

type refundFail struct {
	match string // a substring of the body; "" any
	n     int    // requests still to fail; <0 all
}

// RefundsReceived counts the refund requests that carried key.
func (l *Lab) RefundsReceived(key string) int {
	l.ref.mu.Lock()
	defer l.ref.mu.Unlock()
	return l.ref.received[key]
}

// RefundsApplied counts the refunds applied for key: at most 1 for a
// non-empty key.
func (l *Lab) RefundsApplied(key string) int {
	l.ref.mu.Lock()
	defer l.ref.mu.Unlock()
	return l.ref.applied[key]
}

// RefundOrder lists the refunds applied, in order.
func (l *Lab) RefundOrder() []Refund {
	l.ref.mu.Lock()
	defer l.ref.mu.Unlock()
	return append([]Refund(nil), l.ref.order...)
}

// FailRefunds makes the next n refund requests whose body contains match
// ("" any) fail with 503, before they are counted as applied; n < 0:
// every one.
func (l *Lab) FailRefunds(match string, n int) {
	l.ref.mu.Lock()
	defer l.ref.mu.Unlock()
	l.ref.fails = append(l.ref.fails, refundFail{match: match, n: n})
}

// HoldRefunds makes the next refund request wait after it is applied
// and before it is answered, until release (or the lab closes, or its
// client goes away). arrived is closed when it got there.
func (l *Lab) HoldRefunds() (arrived <-chan struct{}, release func()) {
	h := &hold{arrived: make(chan struct{}), release: make(chan struct{})}
	l.ref.mu.Lock()
	l.ref.holds = append(l.ref.holds, h)
	l.ref.mu.Unlock()
	return h.arrived, h.let
}

func (l *Lab) refund(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	f := &l.ref
	f.mu.Lock()
	if f.received == nil {
		f.received, f.applied = map[string]int{}, map[string]int{}
	}
	f.received[key]++
	for i := range f.fails {
		x := &f.fails[i]
		if x.n != 0 && strings.Contains(string(body), x.match) {
			if x.n > 0 {
				x.n--
			}
			f.mu.Unlock()
			http.Error(w, "refund service unavailable", http.StatusServiceUnavailable)
			return
		}
	}
	first := key == "" || f.applied[key] == 0
	if first {
		f.applied[key]++
		f.order = append(f.order, Refund{Key: key, Path: r.URL.Path, Body: string(body)})
	}
	var h *hold
	if len(f.holds) > 0 {
		h, f.holds = f.holds[0], f.holds[1:]
	}
	f.mu.Unlock()
	if h != nil {
		close(h.arrived)
		select {
		case <-h.release:
		case <-l.done:
		case <-r.Context().Done():
			return
		}
	}
	writeJSON(w, map[string]any{"refunded": true, "key": key, "replayed": !first})
}
