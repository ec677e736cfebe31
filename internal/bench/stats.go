package bench

import (
	"fmt"
	"io"
	"math"
	"sort"
	"time"
)

// MinP99Samples is the fewest samples a p99 is stated for: below it the
// 99th percentile is just the largest sample (or one of the largest two),
// so the summary states the max instead.
const MinP99Samples = 100

// Sample collects durations.
type Sample []time.Duration

// Quantile returns the q-quantile (nearest rank).
func (s Sample) Quantile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := s.sorted()
	i := int(math.Ceil(q*float64(len(c)))) - 1
	return c[max(0, min(i, len(c)-1))]
}

func (s Sample) sorted() Sample {
	c := append(Sample(nil), s...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	return c
}

// Median returns the median: the middle sample, or the mean of the two
// middle ones for an even count.
func (s Sample) Median() time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := s.sorted()
	n := len(c)
	if n%2 == 1 {
		return c[n/2]
	}
	return (c[n/2-1] + c[n/2]) / 2
}

// Stats summarizes a sample in milliseconds. P99 is set only with at
// least MinP99Samples samples (else 0: Tail states the max).
type Stats struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms,omitempty"`
	Min float64 `json:"min_ms"`
	Max float64 `json:"max_ms"`
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Stats returns the summary of s.
func (s Sample) Stats() Stats {
	if len(s) == 0 {
		return Stats{}
	}
	c := s.sorted()
	st := Stats{N: len(c), P50: msOf(c.Median()), P95: msOf(c.Quantile(0.95)), Min: msOf(c[0]), Max: msOf(c[len(c)-1])}
	if len(c) >= MinP99Samples {
		st.P99 = msOf(c.Quantile(0.99))
	}
	return st
}

// Tail is the sample's tail as it may be stated: the p99 with at least
// MinP99Samples samples, else the max. It returns the label and value.
func (s Stats) Tail() (string, float64) {
	if s.N >= MinP99Samples {
		return "p99", s.P99
	}
	return "max", s.Max
}

// TailString is Tail formatted, e.g. "p99 4.1 ms" or "max 4.1 ms".
func (s Stats) TailString() string {
	l, v := s.Tail()
	return fmt.Sprintf("%s %.1f ms", l, v)
}

// Rounds summarizes one value measured in several rounds (rates, times):
// the median and the spread.
type Rounds struct {
	N      int       `json:"n"`
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	Values []float64 `json:"values"`
}

// RoundsOf returns the summary of v.
func RoundsOf(v []float64) Rounds {
	if len(v) == 0 {
		return Rounds{}
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Rounds{N: n, Median: med, Min: s[0], Max: s[n-1], Values: append([]float64(nil), v...)}
}

// Format formats the summary with prec decimals: "median (min-max)".
func (r Rounds) Format(prec int) string {
	if r.N == 0 {
		return "-"
	}
	if r.N == 1 {
		return fmt.Sprintf("%.*f (1 round)", prec, r.Median)
	}
	return fmt.Sprintf("%.*f (%.*f-%.*f)", prec, r.Median, prec, r.Min, prec, r.Max)
}

// Ratio returns a / b, and false when b is not a positive number (no
// baseline measured).
func Ratio(a, b float64) (float64, bool) {
	if !(b > 0) || math.IsInf(b, 0) || math.IsNaN(a) {
		return 0, false
	}
	return a / b, true
}

// RatioString formats a / b as "2.50x", or "n/a" without a baseline.
func RatioString(a, b float64) string {
	r, ok := Ratio(a, b)
	if !ok {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", r)
}

func median(v []float64) float64 { return RoundsOf(v).Median }

// progressf returns a printf for progress lines on w (nil: none).
func progressf(w io.Writer) func(format string, a ...any) {
	return func(format string, a ...any) {
		if w != nil {
			fmt.Fprintf(w, format+"\n", a...)
		}
	}
}

// p50Tail formats a p50 and the tail Stats.Tail allows: "2.1 / max 30.0 ms".
func p50Tail(s Stats) string {
	l, v := s.Tail()
	return fmt.Sprintf("%.1f / %s %.1f ms", s.P50, l, v)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
