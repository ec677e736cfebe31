package sched

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics exposes the scheduler's counters to Prometheus: gauges and
// counters are read from Stats at scrape time; the wait histogram is
// observed as jobs start.
type metrics struct {
	s       *Scheduler
	waitVec *prometheus.HistogramVec
	wait    [NumClasses]prometheus.Observer

	queueDepth, running, jobs, bytes, throttled, paused, foreground *prometheus.Desc
}

var waitBuckets = []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

func newMetrics(s *Scheduler) *metrics {
	m := &metrics{
		s: s,
		waitVec: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "molt_sched_wait_seconds", Help: "Time jobs waited in the scheduler's queue, submit to start.", Buckets: waitBuckets,
		}, []string{"class"}),
		queueDepth: prometheus.NewDesc("molt_sched_queue_depth", "Jobs queued, by class.", []string{"class"}, nil),
		running:    prometheus.NewDesc("molt_sched_running", "Jobs running, by class.", []string{"class"}, nil),
		jobs:       prometheus.NewDesc("molt_sched_jobs_total", "Jobs ended, by class and result (done, failed, canceled).", []string{"class", "result"}, nil),
		bytes:      prometheus.NewDesc("molt_sched_bytes_total", "Bytes charged by jobs against the I/O budget.", nil, nil),
		throttled:  prometheus.NewDesc("molt_sched_throttled_seconds_total", "Time jobs waited for I/O budget.", nil, nil),
		paused:     prometheus.NewDesc("molt_sched_paused_seconds_total", "Time jobs waited for foreground work (rollbacks) to end.", nil, nil),
		foreground: prometheus.NewDesc("molt_sched_foreground", "Foreground work (rollbacks) in progress.", nil, nil),
	}
	for c := range m.wait {
		m.wait[c] = m.waitVec.WithLabelValues(Class(c).String())
	}
	return m
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.queueDepth, m.running, m.jobs, m.bytes, m.throttled, m.paused, m.foreground} {
		ch <- d
	}
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	st := m.s.Stats()
	for c, cs := range st.Classes {
		name := Class(c).String()
		ch <- prometheus.MustNewConstMetric(m.queueDepth, prometheus.GaugeValue, float64(cs.Queued), name)
		ch <- prometheus.MustNewConstMetric(m.running, prometheus.GaugeValue, float64(cs.Running), name)
		ch <- prometheus.MustNewConstMetric(m.jobs, prometheus.CounterValue, float64(cs.Done), name, "done")
		ch <- prometheus.MustNewConstMetric(m.jobs, prometheus.CounterValue, float64(cs.Failed), name, "failed")
		ch <- prometheus.MustNewConstMetric(m.jobs, prometheus.CounterValue, float64(cs.Canceled), name, "canceled")
	}
	ch <- prometheus.MustNewConstMetric(m.bytes, prometheus.CounterValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(m.throttled, prometheus.CounterValue, st.ThrottledTime.Seconds())
	ch <- prometheus.MustNewConstMetric(m.paused, prometheus.CounterValue, st.PausedTime.Seconds())
	ch <- prometheus.MustNewConstMetric(m.foreground, prometheus.GaugeValue, float64(st.Foreground))
}

// ClassStats are one class's counters.
type ClassStats struct {
	Queued  int // waiting to start
	Running int
	// Jobs ended: Done without error, Failed with one, Canceled dropped
	// from the queue or failed after being canceled.
	Done, Failed, Canceled uint64
	WaitTime               time.Duration // total, submit to start, of started jobs
	RunTime                time.Duration // total, start to end, of ended jobs
	Bytes                  int64         // charged through Task.Charge
}

// Stats is a snapshot of the scheduler's state and counters.
type Stats struct {
	Classes       [NumClasses]ClassStats // indexed by Class
	Foreground    int                    // holders, Rollback jobs included
	Bytes         int64                  // charged, all classes
	ThrottledTime time.Duration          // total time Charge waited for tokens
	PausedTime    time.Duration          // total time Charge waited for foreground
}

// Stats returns a snapshot of the counters.
func (s *Scheduler) Stats() Stats {
	var st Stats
	s.mu.Lock()
	for c := range st.Classes {
		st.Classes[c] = ClassStats{
			Queued: s.queued[c], Running: s.running[c],
			Done: s.counts[c].done, Failed: s.counts[c].failed, Canceled: s.counts[c].canceled,
			WaitTime: s.counts[c].wait, RunTime: s.counts[c].run,
		}
	}
	st.Foreground = s.fg
	s.mu.Unlock()
	for c := range st.Classes {
		st.Classes[c].Bytes = s.bytes[c].Load()
		st.Bytes += st.Classes[c].Bytes
	}
	st.ThrottledTime = time.Duration(s.throttled.Load())
	st.PausedTime = time.Duration(s.paused.Load())
	return st
}

// Collectors returns the scheduler's Prometheus collectors, to register
// on a registry of the caller's.
func (s *Scheduler) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.met, s.met.waitVec}
}

// Register registers the scheduler's collectors on r.
func (s *Scheduler) Register(r prometheus.Registerer) error {
	for _, c := range s.Collectors() {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}
