package sched

import (
	"sync"
	"time"
)

// bucket is a token bucket of bytes. A take always succeeds and may leave
// the bucket in debt; the taker then waits out the debt. Takers thus wait
// in the order they took, whatever their sizes, and a take larger than
// the burst needs no special case.
type bucket struct {
	mu     sync.Mutex
	rate   float64 // bytes per second
	burst  float64
	tokens float64 // may be negative: debt
	last   time.Time
}

func newBucket(rate, burst int64, now time.Time) *bucket {
	return &bucket{rate: float64(rate), burst: float64(burst), tokens: float64(burst), last: now}
}

func (b *bucket) refillLocked(now time.Time) {
	if now.After(b.last) {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
		b.last = now
	}
}

// take takes n tokens and returns how long the taker must wait before
// using them.
func (b *bucket) take(n int64, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	b.tokens -= float64(n)
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

// refund gives back the part of a take of n that a taker gave up waiting
// for, left before its turn.
func (b *bucket) refund(n int64, left time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(time.Now())
	b.tokens = min(b.burst, b.tokens+min(float64(n), left.Seconds()*b.rate))
}
