package egress

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/egress/ledger"
)

// cheapLedger hands out IDs and keeps nothing: the benchmarks measure
// the proxy, not the ledger's storage.
type cheapLedger struct{ n atomic.Uint64 }

func (l *cheapLedger) Begin(sb string, r ledger.Record) (ledger.Record, error) {
	r.ID = strconv.FormatUint(l.n.Add(1), 10)
	return r, nil
}

func (l *cheapLedger) Finish(string, string, ledger.State, *ledger.Response, string) (ledger.Record, error) {
	return ledger.Record{}, nil
}

func (l *cheapLedger) Match(string, ledger.Identity) ledger.Match { return ledger.Match{} }

func benchServer(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from the world\n")
	}))
	b.Cleanup(srv.Close)
	return srv
}

// benchGet issues sequential GETs on one kept-alive connection and
// reports the median latency beside the mean.
func benchGet(b *testing.B, c *http.Client, url string) {
	get := func() {
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	get() // connections up
	lat := make([]time.Duration, 0, 1<<16)
	b.ReportAllocs()
	for b.Loop() {
		t := time.Now()
		get()
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(t))
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}

func BenchmarkDirectHTTPGet(b *testing.B) {
	srv := benchServer(b)
	c := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer c.CloseIdleConnections()
	benchGet(b, c, srv.URL+"/x")
}

func BenchmarkProxyHTTPGet(b *testing.B) {
	srv := benchServer(b)
	h := newHTTPHarness(b, srvAddr(srv), loopback, ProxyConfig{Ledger: &cheapLedger{}})
	c := h.client(nil)
	defer c.CloseIdleConnections()
	benchGet(b, c, "http://bench.example.test/x")
}

func benchTLSServer(b *testing.B) (*httptest.Server, *x509.CertPool) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from the world\n")
	}))
	b.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return srv, pool
}

func BenchmarkDirectHTTPSGet(b *testing.B) {
	srv, pool := benchTLSServer(b)
	c := &http.Client{Transport: &http.Transport{Proxy: nil,
		TLSClientConfig: &tls.Config{ServerName: "example.com", RootCAs: pool, NextProtos: []string{"http/1.1"}}}}
	defer c.CloseIdleConnections()
	benchGet(b, c, "https://"+srvAddr(srv)+"/x")
}

func BenchmarkProxyHTTPSPassthroughGet(b *testing.B) {
	srv, pool := benchTLSServer(b)
	h := newHarness(b, srvAddr(srv), loopback, ProxyConfig{Ledger: &cheapLedger{}})
	c := h.client(&tls.Config{ServerName: "example.com", RootCAs: pool, NextProtos: []string{"http/1.1"}})
	defer c.CloseIdleConnections()
	benchGet(b, c, "https://example.com/x")
}

func BenchmarkProxyHTTPSInspectGet(b *testing.B) {
	srv, pool := benchTLSServer(b)
	ca, err := NewCA("bench")
	if err != nil {
		b.Fatal(err)
	}
	h := newHarness(b, srvAddr(srv), policy(func(p *Policy) { p.Inspect = true }), ProxyConfig{Ledger: &cheapLedger{}, UpstreamRoots: pool})
	h.ep.CA = ca
	trust := x509.NewCertPool()
	trust.AppendCertsFromPEM(ca.CertPEM())
	c := h.client(&tls.Config{ServerName: "example.com", RootCAs: trust, NextProtos: []string{"http/1.1"}})
	defer c.CloseIdleConnections()
	benchGet(b, c, "https://example.com/x")
}
