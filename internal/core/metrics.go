package core

import (
	"net/http"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the Manager's Prometheus metrics, on a registry of its own
// (several Managers may live in one process: tests, benchmarks).
type metrics struct {
	reg         *prometheus.Registry
	stall       *prometheus.HistogramVec
	capture     *prometheus.HistogramVec
	commit      prometheus.Histogram
	bytes       *prometheus.CounterVec
	checkpoint  *prometheus.CounterVec
	rollback    *prometheus.HistogramVec
	forks       prometheus.Counter
	forksHot    prometheus.Counter
	decisions   *prometheus.CounterVec
	captureWait prometheus.Histogram
	turnDecide  prometheus.Histogram
	// The object store (offload.go).
	uploads   *prometheus.CounterVec
	storeSent prometheus.Counter
	fetches   prometheus.Counter
	evictions prometheus.Counter
	lazy      *prometheus.CounterVec // lazy resumes by result (lazy.go)
	localLazy *prometheus.CounterVec // local lazy resumes by result (lazylocal.go)
	// treeFetches counts file trees fetched from the store, by how
	// (offload.go fetchTree).
	treeFetches *prometheus.CounterVec
}

var latencyBuckets = []float64{.001, .0025, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5}

func newMetrics(m *Manager) *metrics {
	x := &metrics{
		reg: prometheus.NewRegistry(),
		stall: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "molt_checkpoint_stall_seconds", Help: "Time a sandbox was frozen for a checkpoint.", Buckets: latencyBuckets,
		}, []string{"kind"}),
		capture: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "molt_checkpoint_capture_seconds", Help: "Time until a checkpoint call returned (its instant captured).", Buckets: latencyBuckets,
		}, []string{"kind"}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "molt_checkpoint_commit_seconds", Help: "Time from a full checkpoint's start to its commit.", Buckets: latencyBuckets,
		}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "molt_checkpoint_bytes_written_total", Help: "Bytes checkpoints added to storage.",
		}, []string{"kind"}),
		checkpoint: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "molt_checkpoints_total", Help: "Checkpoints by kind and result (committed, failed).",
		}, []string{"kind", "result"}),
		rollback: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "molt_rollback_seconds", Help: "Rollback latency by tier (hot, warm, cold, restart).", Buckets: latencyBuckets,
		}, []string{"tier"}),
		forks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "molt_forks_total", Help: "Sandboxes made by fork.",
		}),
		forksHot: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "molt_forks_from_standby_total", Help: "Forks that adopted a ready standby instead of restoring.",
		}),
		captureWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "molt_checkpoint_queue_seconds", Help: "Time a checkpoint waited for a capture slot (at most one frozen sandbox per CPU).", Buckets: latencyBuckets,
		}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "molt_turn_decisions_total", Help: "Turn ends by decision (none, fs, full).",
		}, []string{"decision"}),
		turnDecide: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "molt_turn_decide_seconds", Help: "Time to collect and classify a turn's effects.", Buckets: latencyBuckets,
		}),
	}
	x.uploads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "molt_store_uploads_total", Help: "Checkpoint uploads to the object store by result (ok, failed).",
	}, []string{"result"})
	x.storeSent = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "molt_store_uploaded_bytes_total", Help: "Bytes uploaded to the object store (new content only: what the store held already is not sent).",
	})
	x.fetches = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "molt_store_fetches_total", Help: "Checkpoints fetched from the object store into the pool.",
	})
	x.evictions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "molt_store_evictions_total", Help: "Local copies of stored checkpoints freed by the --store-cache bound.",
	})
	x.lazy = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "molt_store_lazy_resumes_total", Help: "Resumes from the object store that restored before the memory was fetched, by result (ok: every page came and was checked; failed: the tree was killed or the restore failed).",
	}, []string{"result"})
	x.localLazy = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "molt_lazy_local_resumes_total", Help: "Resumes from the local pool that restored before the memory was in, by result (ok: the lazy-pages daemon had every page; failed: the tree was killed or the restore failed).",
	}, []string{"result"})
	x.treeFetches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "molt_store_tree_fetches_total", Help: "File trees fetched from the object store, by how: image (over the image the sandbox was made from), whole (no such image here), image_refused (over the image, refused by the tree's hash; then fetched whole).",
	}, []string{"how"})
	x.reg.MustRegister(x.stall, x.capture, x.commit, x.bytes, x.checkpoint, x.rollback, x.forks, x.forksHot, x.decisions, x.captureWait, x.turnDecide,
		x.uploads, x.storeSent, x.fetches, x.evictions, x.lazy, x.localLazy, x.treeFetches)
	x.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "molt_pending_checkpoints", Help: "Full checkpoints captured and not yet committed (the persist queue).",
	}, func() float64 {
		m.pipe.mu.Lock()
		defer m.pipe.mu.Unlock()
		return float64(len(m.pipe.jobs))
	}))
	x.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "molt_standbys", Help: "Pre-restored standbys ready for hot rollback.",
	}, func() float64 {
		n, _ := m.sby.Totals()
		return float64(n)
	}))
	x.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "molt_standby_bytes", Help: "Image bytes held by standbys (counted against --standby-budget).",
	}, func() float64 {
		_, n := m.sby.Totals()
		return float64(n)
	}))
	x.reg.MustRegister(&sandboxCollector{m: m, desc: prometheus.NewDesc("molt_sandboxes", "Sandboxes by state.", []string{"state"}, nil)})
	return x
}

// sandboxCollector counts sandboxes by reported state at scrape time.
type sandboxCollector struct {
	m    *Manager
	desc *prometheus.Desc
}

func (c *sandboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]int{v1.StateRunning: 0, v1.StateStopped: 0, v1.StateHibernated: 0, v1.StateLost: 0}
	if recs, err := meta.List[sandboxRec](c.m.db, meta.Sandboxes); err == nil {
		for _, r := range recs {
			counts[c.m.report(r).State]++
		}
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), state)
	}
}

func seconds(msv float64) float64 { return msv / 1000 }

func (x *metrics) checkpointed(ck meta.Checkpoint, captured time.Duration) {
	x.stall.WithLabelValues(ck.Kind).Observe(seconds(ck.StallMS))
	x.capture.WithLabelValues(ck.Kind).Observe(captured.Seconds())
	if !ck.Pending {
		x.committed(ck)
	}
}

func (x *metrics) committed(ck meta.Checkpoint) {
	x.bytes.WithLabelValues(ck.Kind).Add(float64(ck.BytesWritten))
	x.checkpoint.WithLabelValues(ck.Kind, "committed").Inc()
	if ck.Kind == v1.KindFull {
		x.commit.Observe(seconds(ck.DurationMS))
	}
}

// MetricsHandler serves the Prometheus text exposition of the Manager's
// metrics.
func (m *Manager) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(m.metrics.reg, promhttp.HandlerOpts{})
}
