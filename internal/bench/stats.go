package bench

import (
	"fmt"
	"io"
	"math"
	"sort"
	"time"
)

// Sample collects durations.
type Sample []time.Duration

// Quantile returns the q-quantile (nearest rank).
func (s Sample) Quantile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := append(Sample(nil), s...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	i := int(math.Ceil(q*float64(len(c)))) - 1
	return c[max(0, min(i, len(c)-1))]
}

// Stats summarizes a sample in milliseconds.
type Stats struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms"`
}

// Stats returns the summary of s.
func (s Sample) Stats() Stats {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return Stats{N: len(s), P50: ms(s.Quantile(0.5)), P95: ms(s.Quantile(0.95)), P99: ms(s.Quantile(0.99))}
}

// progressf returns a printf for progress lines on w (nil: none).
func progressf(w io.Writer) func(format string, a ...any) {
	return func(format string, a ...any) {
		if w != nil {
			fmt.Fprintf(w, format+"\n", a...)
		}
	}
}
