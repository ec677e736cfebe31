package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/egress/ledger"
)

// fakeLedger keeps records in memory; match decides what Match returns.
type fakeLedger struct {
	mu    sync.Mutex
	recs  []ledger.Record
	match func(ledger.Identity) ledger.Match
}

func (f *fakeLedger) Begin(sb string, r ledger.Record) (ledger.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r.Seq = uint64(len(f.recs) + 1)
	r.ID = fmt.Sprintf("r%d", r.Seq)
	r.Sandbox = sb
	if r.State == "" {
		r.State = ledger.Pending
	} else {
		r.Finished = time.Now()
	}
	f.recs = append(f.recs, r)
	return r, nil
}

func (f *fakeLedger) Finish(sb, id string, state ledger.State, resp *ledger.Response, errText string) (ledger.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.recs {
		if f.recs[i].ID == id {
			if f.recs[i].State != ledger.Pending {
				return ledger.Record{}, fmt.Errorf("record %s is %s", id, f.recs[i].State)
			}
			f.recs[i].State, f.recs[i].Response, f.recs[i].Error, f.recs[i].Finished = state, resp, errText, time.Now()
			return f.recs[i], nil
		}
	}
	return ledger.Record{}, fmt.Errorf("no record %s", id)
}

func (f *fakeLedger) Match(sb string, id ledger.Identity) ledger.Match {
	if f.match == nil {
		return ledger.Match{}
	}
	return f.match(id)
}

func (f *fakeLedger) records() []ledger.Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]ledger.Record(nil), f.recs...)
}

// waitRecords waits until n records exist and none is pending.
func (f *fakeLedger) waitRecords(t *testing.T, n int) []ledger.Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		recs := f.records()
		done := len(recs) >= n
		for _, r := range recs {
			if r.State == ledger.Pending {
				done = false
			}
		}
		if done {
			if len(recs) != n {
				t.Fatalf("want %d records, got %d: %+v", n, len(recs), recs)
			}
			return recs
		}
		if time.Now().After(deadline) {
			t.Fatalf("want %d finished records, got %+v", n, recs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type harness struct {
	p      *Proxy
	addr   string // the proxy's listening address
	led    *fakeLedger
	ep     *Endpoint
	served chan error
}

// newHarness starts a proxy on loopback that sends every connection to
// dst, as the router's redirect would.
func newHarness(t testing.TB, dst string, pol Policy, cfg ProxyConfig) *harness {
	t.Helper()
	d := netip.MustParseAddrPort(dst)
	pol.AllowCIDRs = slices.Clone(pol.AllowCIDRs) // Validate normalizes in place
	if err := pol.Validate(); err != nil {
		t.Fatal(err)
	}
	ep := &Endpoint{ID: "sb1", Addr: netip.MustParseAddr("127.0.0.1"), Policy: pol,
		Turn: func() int { return 7 }, Head: func() string { return "ck3" }}
	led := &fakeLedger{}
	if cfg.Lookup == nil {
		cfg.Lookup = func(src netip.Addr) (*Endpoint, bool) {
			if src == ep.Addr {
				return ep, true
			}
			return nil, false
		}
	}
	if cfg.Ledger == nil {
		cfg.Ledger = led
	}
	cfg.OrigDst = func(net.Conn) (netip.AddrPort, error) { return d, nil }
	p := NewProxy(cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{p: p, addr: l.Addr().String(), led: led, ep: ep, served: make(chan error, 1)}
	go func() { h.served <- p.Serve(l) }()
	t.Cleanup(func() {
		p.Close()
		select {
		case err := <-h.served:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Serve did not return after Close")
		}
	})
	return h
}

// newHTTPHarness is newHarness with dst's port parsed as HTTP.
func newHTTPHarness(t testing.TB, dst string, pol Policy, cfg ProxyConfig) *harness {
	pol.HTTPPorts = append(pol.HTTPPorts, netip.MustParseAddrPort(dst).Port())
	return newHarness(t, dst, pol, cfg)
}

// client is an HTTP client whose every connection goes to the proxy.
func (h *harness) client(tc *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", h.addr)
		},
		TLSClientConfig:   tc,
		DisableKeepAlives: false,
	}}
}

var loopback = Policy{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}

func policy(f func(*Policy)) Policy {
	p := loopback
	p.AllowCIDRs = append([]netip.Prefix(nil), loopback.AllowCIDRs...)
	if f != nil {
		f(&p)
	}
	return p
}

// countingServer counts requests and echoes what it got.
func countingServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Host", r.Host)
		w.Header().Set("X-Method", r.Method)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "got %s %s %q", r.Method, r.URL.RequestURI(), b)
	}))
	conns := new(atomic.Int64)
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	serverConns.Store(srv, conns)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &n
}

// serverConns counts the connections each countingServer accepted.
var serverConns sync.Map

func srvAddr(srv *httptest.Server) string { return srv.Listener.Addr().String() }

func do(t *testing.T, c *http.Client, method, url, body string) (*http.Response, string) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestProxyHTTPGetRecordedAsRead(t *testing.T) {
	srv, n := countingServer(t)
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	c := h.client(nil)
	resp, body := do(t, c, "GET", "http://api.example.test/v1/things?b=2&a=1", "")
	if resp.StatusCode != 201 || body != `got GET /v1/things?b=2&a=1 ""` {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if got := resp.Header.Get("X-Host"); got != "api.example.test" {
		t.Errorf("server saw Host %q, want the sandbox's", got)
	}
	// The connection is reused: a second request on it.
	do(t, c, "GET", "http://api.example.test/again", "")
	recs := h.led.waitRecords(t, 2)
	r := recs[0]
	if r.Kind != ledger.Read || r.State != ledger.Completed || r.Request.Method != "GET" ||
		r.Request.Host != "api.example.test" || r.Request.Addr != srvAddr(srv) ||
		r.Request.URL != "http://api.example.test/v1/things?a=1&b=2" {
		t.Errorf("record %+v", r)
	}
	if r.Turn != 7 || r.Checkpoint != "ck3" || r.Sandbox != "sb1" {
		t.Errorf("record turn %d checkpoint %q sandbox %q", r.Turn, r.Checkpoint, r.Sandbox)
	}
	if resp.Header.Get(HeaderLedgerID) != r.ID {
		t.Errorf("%s %q, want %q", HeaderLedgerID, resp.Header.Get(HeaderLedgerID), r.ID)
	}
	if r.Response == nil || r.Response.Status != 201 || string(r.Response.Body) != body || r.Response.BodySize != int64(len(body)) || r.Response.BodyHash == "" {
		t.Errorf("response %+v", r.Response)
	}
	if c, _ := serverConns.Load(srv); c.(*atomic.Int64).Load() != 1 {
		t.Errorf("server got %d connections, want 1 (pooled)", c.(*atomic.Int64).Load())
	}
	if n.Load() != 2 {
		t.Errorf("server got %d requests, want 2", n.Load())
	}
}

func TestProxyHTTPPostRecordedAsEffect(t *testing.T) {
	srv, n := countingServer(t)
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	resp, body := do(t, h.client(nil), "POST", "http://pay.example.test/charge", `{"amount":5}`)
	if resp.StatusCode != 201 || body != `got POST /charge "{\"amount\":5}"` {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	r := h.led.waitRecords(t, 1)[0]
	if r.Kind != ledger.Effect || r.State != ledger.Completed || r.Request.Method != "POST" || r.Request.BodyHash == "" {
		t.Errorf("record %+v", r)
	}
	if n.Load() != 1 {
		t.Errorf("server got %d requests", n.Load())
	}
}

func TestProxyReplaysOrphan(t *testing.T) {
	srv, n := countingServer(t)
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	var asked ledger.Identity
	h.led.match = func(id ledger.Identity) ledger.Match {
		asked = id
		return ledger.Match{Orphans: 1, Orphan: &ledger.Record{ID: "orphan1", Response: &ledger.Response{
			Status: 202, Header: map[string][]string{"X-Paid": {"yes"}, "Content-Length": {"999"}}, Body: []byte("paid once")}}}
	}
	resp, body := do(t, h.client(nil), "POST", "http://pay.example.test/charge", `{"amount":5}`)
	if resp.StatusCode != 202 || body != "paid once" || resp.Header.Get("X-Paid") != "yes" {
		t.Fatalf("got %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if resp.Header.Get(HeaderReplayed) != "orphan1" {
		t.Errorf("%s %q", HeaderReplayed, resp.Header.Get(HeaderReplayed))
	}
	if n.Load() != 0 {
		t.Errorf("server got %d requests, want none", n.Load())
	}
	r := h.led.waitRecords(t, 1)[0]
	if r.State != ledger.Replayed || r.ReplayOf != "orphan1" || r.Kind != ledger.Effect || resp.Header.Get(HeaderLedgerID) != r.ID {
		t.Errorf("record %+v", r)
	}
	if asked.Method != "POST" || asked.URL != "http://pay.example.test/charge" || asked.Addr != srvAddr(srv) {
		t.Errorf("matched identity %+v", asked)
	}
}

func TestProxyRefusesWhilePending(t *testing.T) {
	srv, n := countingServer(t)
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	h.led.match = func(ledger.Identity) ledger.Match {
		return ledger.Match{Pending: &ledger.Record{ID: "p9"}}
	}
	c := h.client(nil)
	resp, body := do(t, c, "POST", "http://pay.example.test/charge", `x`)
	if resp.StatusCode != 409 || !strings.Contains(body, "p9") || !strings.Contains(body, "unknown") {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	// Reads are forwarded whatever the ledger says.
	if resp, _ := do(t, c, "GET", "http://pay.example.test/balance", ""); resp.StatusCode != 201 {
		t.Errorf("GET got %d", resp.StatusCode)
	}
	recs := h.led.waitRecords(t, 2)
	if r := recs[0]; r.State != ledger.Refused || r.ReplayOf != "p9" {
		t.Errorf("record %+v", r)
	}
	if n.Load() != 1 {
		t.Errorf("server got %d requests, want the GET only", n.Load())
	}
}

func TestProxyDivergence(t *testing.T) {
	srv, n := countingServer(t)
	orphans := func(ledger.Identity) ledger.Match { return ledger.Match{Orphans: 2} }

	h := newHTTPHarness(t, srvAddr(srv), policy(func(p *Policy) { p.Divergence = DivergeBlock }), ProxyConfig{})
	h.led.match = orphans
	resp, body := do(t, h.client(nil), "PUT", "http://pay.example.test/other", `y`)
	if resp.StatusCode != 409 || body != "molt egress: request diverges from history after a rollback; blocked by policy\n" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if r := h.led.waitRecords(t, 1)[0]; r.State != ledger.Blocked {
		t.Errorf("record %+v", r)
	}
	if n.Load() != 0 {
		t.Errorf("server got %d requests", n.Load())
	}

	h2 := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{}) // forward is the default
	h2.led.match = orphans
	if resp, _ := do(t, h2.client(nil), "PUT", "http://pay.example.test/other", `y`); resp.StatusCode != 201 {
		t.Fatalf("forward: got %d", resp.StatusCode)
	}
	if r := h2.led.waitRecords(t, 1)[0]; r.State != ledger.Completed {
		t.Errorf("record %+v", r)
	}
	if n.Load() != 1 {
		t.Errorf("server got %d requests", n.Load())
	}
}

func TestProxyDomainDenied(t *testing.T) {
	srv, n := countingServer(t)
	h := newHTTPHarness(t, srvAddr(srv), policy(func(p *Policy) { p.DenyDomains = []string{"example.test"} }), ProxyConfig{})
	resp, body := do(t, h.client(nil), "POST", "http://api.example.test/x", "z")
	want := "molt egress: domain api.example.test is denied by the sandbox's egress policy\n"
	if resp.StatusCode != 403 || body != want {
		t.Fatalf("got %d %q, want 403 %q", resp.StatusCode, body, want)
	}
	r := h.led.waitRecords(t, 1)[0]
	if r.State != ledger.Denied || r.Request.Host != "api.example.test" || r.Error == "" || resp.Header.Get(HeaderLedgerID) != r.ID {
		t.Errorf("record %+v", r)
	}
	if n.Load() != 0 {
		t.Errorf("server got %d requests", n.Load())
	}
}

func TestProxyDefaultDeniesLoopback(t *testing.T) {
	srv, n := countingServer(t)
	h := newHTTPHarness(t, srvAddr(srv), Policy{}, ProxyConfig{})
	_, err := h.client(nil).Get("http://api.example.test/")
	if err == nil || !strings.Contains(err.Error(), "reset") {
		t.Fatalf("want a reset, got %v", err)
	}
	r := h.led.waitRecords(t, 1)[0]
	if r.State != ledger.Denied || r.Kind != ledger.Opaque || r.Request.Addr != srvAddr(srv) || !strings.Contains(r.Error, "denied by default") {
		t.Errorf("record %+v", r)
	}
	if n.Load() != 0 {
		t.Errorf("server got %d requests", n.Load())
	}
}

func TestProxyDeniesUnnamedAddressWithDomainAllowList(t *testing.T) {
	srv, n := countingServer(t)
	h := newHTTPHarness(t, srvAddr(srv), policy(func(p *Policy) { p.AllowDomains = []string{"example.test"} }), ProxyConfig{Names: &Names{}})
	resp, _ := do(t, h.client(nil), "GET", "http://"+srvAddr(srv)+"/", "")
	if resp.StatusCode != 403 {
		t.Fatalf("got %d", resp.StatusCode)
	}
	// Once the sandbox resolved a name in the allow list to it, it goes.
	h.p.cfg.Names.Add("sb1", "api.example.test", []netip.Addr{netip.MustParseAddr("127.0.0.1")}, time.Minute)
	resp, _ = do(t, h.client(nil), "GET", "http://"+srvAddr(srv)+"/", "")
	if resp.StatusCode != 201 || n.Load() != 1 {
		t.Fatalf("got %d, server %d", resp.StatusCode, n.Load())
	}
	if r := h.led.waitRecords(t, 2)[1]; r.Request.Host != "api.example.test" && r.Request.Host != "127.0.0.1" {
		t.Errorf("record %+v", r)
	}
}

// An allowed name in the Host header does not make an address the
// sandbox resolved to a denied name (or never resolved) reachable.
func TestProxyAllowListNeedsTheAddressesName(t *testing.T) {
	srv, n := countingServer(t)
	// The sandbox connects to a public address (no allow CIDR names it);
	// the proxy's dials reach the test server.
	dst := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.77"), netip.MustParseAddrPort(srvAddr(srv)).Port()).String()
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, srvAddr(srv))
	}
	pol := policy(func(p *Policy) { p.AllowDomains, p.AllowCIDRs = []string{"example.test"}, nil })
	h := newHTTPHarness(t, dst, pol, ProxyConfig{Names: &Names{}, Dial: dial})
	resp, body := do(t, h.client(nil), "GET", "http://api.example.test/", "")
	if resp.StatusCode != 403 || !strings.Contains(body, "not resolved") {
		t.Fatalf("never resolved: got %d %q", resp.StatusCode, body)
	}
	h.p.cfg.Names.Add("sb1", "evil.test", []netip.Addr{netip.MustParseAddr("203.0.113.77")}, time.Minute)
	resp, body = do(t, h.client(nil), "GET", "http://api.example.test/", "")
	if resp.StatusCode != 403 || !strings.Contains(body, "evil.test") {
		t.Fatalf("resolved to a denied name: got %d %q", resp.StatusCode, body)
	}
	if n.Load() != 0 {
		t.Errorf("server got %d requests", n.Load())
	}
	// Resolved to an allowed name: it goes.
	h.p.cfg.Names.Add("sb1", "api.example.test", []netip.Addr{netip.MustParseAddr("203.0.113.77")}, time.Minute)
	if resp, body = do(t, h.client(nil), "GET", "http://api.example.test/", ""); resp.StatusCode != 201 || n.Load() != 1 {
		t.Fatalf("resolved to an allowed name: got %d %q", resp.StatusCode, body)
	}
}

func TestProxyUpstreamDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	h := newHTTPHarness(t, dead, loopback, ProxyConfig{})
	resp, body := do(t, h.client(nil), "POST", "http://pay.example.test/", "a")
	if resp.StatusCode != 502 || !strings.HasPrefix(body, "molt egress: upstream") {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	r := h.led.waitRecords(t, 1)[0]
	if r.State != ledger.Failed || !strings.Contains(r.Error, "refused") || resp.Header.Get(HeaderLedgerID) != r.ID {
		t.Errorf("record %+v", r)
	}
}

func TestProxyLargeRequestBodyStreams(t *testing.T) {
	srv, n := countingServer(t)
	// An orphan the ledger offers is not used: a body over the cap has
	// no hash, so nothing is shown equivalent to it.
	orphan := func(ledger.Identity) ledger.Match {
		return ledger.Match{Orphans: 1, Orphan: &ledger.Record{ID: "o1", Response: &ledger.Response{Status: 299}}}
	}
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{BodyCap: 10})
	h.led.match = orphan
	big := strings.Repeat("b", 100)
	resp, body := do(t, h.client(nil), "POST", "http://pay.example.test/upload", big)
	if resp.StatusCode != 201 || !strings.Contains(body, big) {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	r := h.led.waitRecords(t, 1)[0]
	if r.State != ledger.Completed || r.Request.BodyHash != "" || !r.Response.Truncated || len(r.Response.Body) != 10 ||
		r.Response.BodySize != int64(len(body)) || !strings.Contains(r.Error, "request body sha256") {
		t.Errorf("record %+v response %+v", r, r.Response)
	}
	if n.Load() != 1 {
		t.Errorf("server got %d", n.Load())
	}

	// With divergence blocked it is blocked while the line has orphans.
	hb := newHTTPHarness(t, srvAddr(srv), policy(func(p *Policy) { p.Divergence = DivergeBlock }), ProxyConfig{BodyCap: 10})
	hb.led.match = orphan
	if resp, _ := do(t, hb.client(nil), "POST", "http://pay.example.test/upload", big); resp.StatusCode != 409 {
		t.Errorf("blocked: got %d", resp.StatusCode)
	}
	if n.Load() != 1 {
		t.Errorf("server got %d", n.Load())
	}
}

func TestProxyHostileHTTP(t *testing.T) {
	srv, n := countingServer(t)
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	for name, in := range map[string]string{
		"garbage":     "\x00\xff\x16 not http at all\r\n\r\n",
		"huge header": "GET / HTTP/1.1\r\nHost: a.test\r\nX-Big: " + strings.Repeat("a", 2<<20) + "\r\n\r\n",
	} {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		go func() { io.WriteString(c, in) }()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Errorf("%s: %v", name, err)
		} else if resp.StatusCode != 400 && resp.StatusCode != 431 {
			t.Errorf("%s: got %d", name, resp.StatusCode)
		}
		c.Close()
	}
	if n.Load() != 0 || len(h.led.records()) != 0 {
		t.Errorf("server got %d, ledger %d", n.Load(), len(h.led.records()))
	}
}

func tlsServer(t *testing.T) (*httptest.Server, *atomic.Int64, *x509.CertPool) {
	var n atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		fmt.Fprintf(w, "secret for %s %s", r.Host, r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return srv, &n, pool
}

func TestProxyTLSPassthrough(t *testing.T) {
	srv, n, pool := tlsServer(t)
	h := newHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	c := h.client(&tls.Config{ServerName: "example.com", RootCAs: pool})
	resp, body := do(t, c, "GET", "https://example.com/a", "")
	if resp.StatusCode != 200 || body != "secret for example.com /a" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if resp.TLS.PeerCertificates[0].Equal(srv.Certificate()) == false {
		t.Errorf("the sandbox did not see the server's own certificate")
	}
	c.CloseIdleConnections()
	r := h.led.waitRecords(t, 1)[0]
	if r.Kind != ledger.Opaque || r.State != ledger.Completed || r.Request.Proto != "tls" || r.Request.Host != "example.com" || r.Request.Addr != srvAddr(srv) {
		t.Errorf("record %+v", r)
	}
	if r.Response == nil || r.Response.BytesOut < 200 || r.Response.BytesIn < 500 {
		t.Errorf("bytes %+v", r.Response)
	}
	if n.Load() != 1 {
		t.Errorf("server got %d", n.Load())
	}
}

func TestProxyTLSDomainDenied(t *testing.T) {
	srv, n, pool := tlsServer(t)
	h := newHarness(t, srvAddr(srv), policy(func(p *Policy) { p.AllowDomains = []string{"other.test"} }), ProxyConfig{})
	_, err := h.client(&tls.Config{ServerName: "example.com", RootCAs: pool}).Get("https://example.com/")
	if err == nil {
		t.Fatal("want an error")
	}
	r := h.led.waitRecords(t, 1)[0]
	if r.State != ledger.Denied || r.Request.Host != "example.com" || r.Request.Proto != "tls" {
		t.Errorf("record %+v", r)
	}
	if n.Load() != 0 {
		t.Errorf("server got %d", n.Load())
	}
}

func TestProxyTLSInspect(t *testing.T) {
	srv, n, pool := tlsServer(t)
	ca, err := NewCA("molt sandbox sb1")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, srvAddr(srv), policy(func(p *Policy) { p.Inspect = true }), ProxyConfig{UpstreamRoots: pool})
	h.ep.CA = ca
	trust := x509.NewCertPool()
	trust.AppendCertsFromPEM(ca.CertPEM())
	// Off port 443, only a client offering HTTP in ALPN is inspected.
	c := h.client(&tls.Config{ServerName: "example.com", RootCAs: trust, NextProtos: []string{"http/1.1"}})
	resp, body := do(t, c, "POST", "https://example.com/pay?x=1", "amount=5")
	if resp.StatusCode != 200 || body != "secret for example.com /pay" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; iss != "molt sandbox sb1" {
		t.Errorf("leaf issued by %q", iss)
	}
	do(t, c, "GET", "https://example.com/again", "")
	recs := h.led.waitRecords(t, 2)
	r := recs[0]
	if r.Kind != ledger.Effect || r.State != ledger.Completed || r.Request.Proto != "https" || r.Request.Method != "POST" ||
		r.Request.URL != "https://example.com/pay?x=1" || r.Request.BodyHash == "" || string(r.Response.Body) != body ||
		resp.Header.Get(HeaderLedgerID) != r.ID {
		t.Errorf("record %+v", r)
	}
	if recs[1].Kind != ledger.Read {
		t.Errorf("record %+v", recs[1])
	}
	if n.Load() != 2 {
		t.Errorf("server got %d", n.Load())
	}

	// A server the upstream roots do not vouch for is refused.
	h2 := newHarness(t, srvAddr(srv), policy(func(p *Policy) { p.Inspect = true }), ProxyConfig{UpstreamRoots: x509.NewCertPool()})
	h2.ep.CA = ca
	resp, _ = do(t, h2.client(&tls.Config{ServerName: "example.com", RootCAs: trust, NextProtos: []string{"http/1.1"}}), "GET", "https://example.com/", "")
	if resp.StatusCode != 502 {
		t.Errorf("unverified upstream: got %d", resp.StatusCode)
	}
	if r := h2.led.waitRecords(t, 1)[0]; r.State != ledger.Failed || !strings.Contains(r.Error, "certificate") {
		t.Errorf("record %+v", r)
	}
}

func echoServer(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

func TestProxyRawTCP(t *testing.T) {
	h := newHarness(t, echoServer(t), loopback, ProxyConfig{})
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "hello, ")
	io.WriteString(c, "world")
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "hello, world" {
		t.Fatalf("got %q, %v", got, err)
	}
	r := h.led.waitRecords(t, 1)[0]
	if r.Kind != ledger.Opaque || r.State != ledger.Completed || r.Request.Proto != "tcp" ||
		r.Response.BytesOut != 12 || r.Response.BytesIn != 12 {
		t.Errorf("record %+v %+v", r, r.Response)
	}
}

// A server that speaks first is reached although the client is silent.
func TestProxyRawTCPServerFirst(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			io.WriteString(c, "220 ready\r\n")
			c.Close()
		}
	}()
	h := newHarness(t, l.Addr().String(), loopback, ProxyConfig{})
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "220 ready\r\n" {
		t.Fatalf("got %q, %v", line, err)
	}
	c.Close()
	if r := h.led.waitRecords(t, 1)[0]; r.Response.BytesIn != 11 {
		t.Errorf("record %+v", r.Response)
	}
}

func TestProxyRawTCPDialFails(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	h := newHarness(t, dead, loopback, ProxyConfig{})
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "x")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || !strings.Contains(err.Error(), "reset") {
		t.Errorf("want a reset, got %v", err)
	}
	if r := h.led.waitRecords(t, 1)[0]; r.State != ledger.Failed || !strings.Contains(r.Error, "dial") {
		t.Errorf("record %+v", r)
	}
}

func TestProxyCloseEndsConnections(t *testing.T) {
	h := newHarness(t, echoServer(t), loopback, ProxyConfig{})
	srv, _ := countingServer(t)
	h2 := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	var conns []net.Conn
	for _, a := range []string{h.addr, h2.addr, h2.addr} {
		c, err := net.Dial("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	io.WriteString(conns[0], "open tunnel")        // a raw tunnel, live
	io.WriteString(conns[1], "GET / HTTP/1.1\r\n") // a request half sent
	// conns[2] is idle
	time.Sleep(100 * time.Millisecond)
	done := make(chan struct{})
	go func() {
		h.p.Close()
		h2.p.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadAll(c); err != nil && !strings.Contains(err.Error(), "reset") {
			t.Errorf("conn %d: %v", i, err)
		}
	}
	if _, err := net.DialTimeout("tcp", h.addr, time.Second); err == nil {
		t.Error("the listener still accepts")
	}
}

func TestProxyUnknownSourceClosed(t *testing.T) {
	srv, n := countingServer(t)
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{Lookup: func(netip.Addr) (*Endpoint, bool) { return nil, false }})
	if _, err := h.client(nil).Get("http://a.test/"); err == nil {
		t.Fatal("want an error")
	}
	if n.Load() != 0 || len(h.led.records()) != 0 {
		t.Errorf("server %d, ledger %d", n.Load(), len(h.led.records()))
	}
}

func TestProxyNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Run("traffic", func(t *testing.T) {
		srv, _ := countingServer(t)
		h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
		c := h.client(nil)
		do(t, c, "GET", "http://a.test/", "")
		do(t, c, "POST", "http://a.test/", "b")
		c.CloseIdleConnections()
		he := newHarness(t, echoServer(t), loopback, ProxyConfig{})
		for range 3 {
			e, err := net.Dial("tcp", he.addr)
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(e, "x")
			e.(*net.TCPConn).CloseWrite()
			io.ReadAll(e)
			e.Close()
		}
		idle, err := net.Dial("tcp", he.addr) // left open: Close must end it
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { idle.Close() })
		h.led.waitRecords(t, 2)
		he.led.waitRecords(t, 3)
	})
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An upstream response delimited by the end of its connection reaches
// the sandbox whole, and the sandbox's connection stays usable.
func TestProxyCloseDelimitedResponse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
					io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
				}
			}()
		}
	}()
	h := newHTTPHarness(t, l.Addr().String(), loopback, ProxyConfig{})
	c := h.client(nil)
	c.Timeout = 10 * time.Second
	for i := range 2 {
		resp, body := do(t, c, "GET", "http://a.test/", "")
		if resp.StatusCode != 200 || body != "until the end" {
			t.Fatalf("request %d: got %d %q", i, resp.StatusCode, body)
		}
	}
	if len(h.led.waitRecords(t, 2)) != 2 {
		t.Fatal()
	}
}

func TestProxyRefusesConnect(t *testing.T) {
	srv, n := countingServer(t)
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "CONNECT elsewhere.test:443 HTTP/1.1\r\nHost: elsewhere.test:443\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("got %v, %v", resp, err)
	}
	if r := h.led.waitRecords(t, 1)[0]; r.State != ledger.Denied {
		t.Errorf("record %+v", r)
	}
	if n.Load() != 0 {
		t.Errorf("server got %d", n.Load())
	}
}

// Off port 443, TLS from a client that offers no HTTP protocol passes
// through even with inspection on (it may not be HTTP at all).
func TestProxyInspectPassesNonHTTPTLS(t *testing.T) {
	srv, _, pool := tlsServer(t)
	ca, err := NewCA("molt sandbox sb1")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, srvAddr(srv), policy(func(p *Policy) { p.Inspect = true }), ProxyConfig{UpstreamRoots: pool})
	h.ep.CA = ca
	c := h.client(&tls.Config{ServerName: "example.com", RootCAs: pool})
	if resp, _ := do(t, c, "GET", "https://example.com/", ""); !resp.TLS.PeerCertificates[0].Equal(srv.Certificate()) {
		t.Error("the client did not reach the server's own TLS")
	}
	c.CloseIdleConnections()
	if r := h.led.waitRecords(t, 1)[0]; r.Kind != ledger.Opaque || r.Request.Proto != "tls" {
		t.Errorf("record %+v", r)
	}
}

// An upstream cannot make a response look replayed.
func TestProxyStripsUpstreamReplayHeader(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderReplayed, "fake")
		w.Header().Set(HeaderLedgerID, "fake")
	}))
	defer srv.Close()
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	resp, _ := do(t, h.client(nil), "POST", "http://a.test/", "x")
	if resp.Header.Get(HeaderReplayed) != "" || resp.Header.Get(HeaderLedgerID) != "r1" {
		t.Errorf("headers %v", resp.Header)
	}
}

// A sandbox's requests beyond its in-flight slots wait for one.
func TestProxyInFlightBound(t *testing.T) {
	unblock := make(chan struct{})
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			<-unblock
		}
	}))
	defer srv.Close()
	defer close(unblock)
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	h.p.mu.Lock()
	h.p.maxInFlight = 1
	h.p.mu.Unlock()
	c := h.client(nil)
	first := make(chan error, 1)
	go func() {
		resp, err := c.Get("http://a.test/slow")
		if err == nil {
			resp.Body.Close()
		}
		first <- err
	}()
	for n.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	second := make(chan error, 1)
	go func() {
		resp, err := c.Get("http://a.test/fast")
		if err == nil {
			resp.Body.Close()
		}
		second <- err
	}()
	select {
	case <-second:
		t.Fatal("the second request went while the first held the only slot")
	case <-time.After(200 * time.Millisecond):
	}
	unblock <- struct{}{}
	for _, ch := range []chan error{first, second} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("request stuck")
		}
	}
	// The proxy releases a slot after the client has its response: give
	// it a moment.
	left := -1
	for deadline := time.Now().Add(5 * time.Second); left != 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		h.p.mu.Lock()
		left = len(h.p.inFlight)
		h.p.mu.Unlock()
	}
	if left != 0 {
		t.Errorf("%d slot entries left", left)
	}
}

func TestProxyUpgrade(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want an upgrade", 400)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		io.Copy(c, brw)
	}))
	defer srv.Close()
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 || resp.Header.Get(HeaderLedgerID) == "" {
		t.Fatalf("got %+v, %v", resp, err)
	}
	io.WriteString(c, "ping")
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(br)
	if err != nil || string(got) != "ping" {
		t.Fatalf("got %q, %v", got, err)
	}
	r := h.led.waitRecords(t, 1)[0]
	if r.State != ledger.Completed || r.Response.Status != 101 || r.Response.BytesOut != 4 || r.Response.BytesIn != 4 {
		t.Errorf("record %+v %+v", r, r.Response)
	}
}

func TestProxyExpectContinue(t *testing.T) {
	srv, n := countingServer(t)
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "POST /up HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("got %q, %v", line, err)
	}
	br.ReadString('\n')
	io.WriteString(c, "hello")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("got %+v, %v", resp, err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != `got POST /up "hello"` || n.Load() != 1 {
		t.Errorf("got %q, server %d", b, n.Load())
	}
}

// Without a ledger nothing leaves: every effect is recorded first.
func TestProxyWithoutLedgerSendsNothing(t *testing.T) {
	srv, n := countingServer(t)
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	h.p.cfg.Ledger = nil
	resp, _ := do(t, h.client(nil), "POST", "http://a.test/", "x")
	if resp.StatusCode != 502 || n.Load() != 0 {
		t.Errorf("got %d, server %d", resp.StatusCode, n.Load())
	}
	he := newHarness(t, echoServer(t), loopback, ProxyConfig{})
	he.p.cfg.Ledger = nil
	c, err := net.Dial("tcp", he.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "x")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("a raw connection went through without a ledger")
	}
}

// A request that reached the world without an answer stays pending: its
// outcome is unknown, so after a rollback it must not count as never
// sent. A read in the same case simply failed.
func TestProxyNoAnswerAfterSendStaysPending(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		io.ReadAll(r.Body)
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close() // took the request, never answered
		}
	}))
	defer srv.Close()
	h := newHTTPHarness(t, srvAddr(srv), loopback, ProxyConfig{})
	c := h.client(nil)
	resp, body := do(t, c, "POST", "http://pay.example.test/charge", "amount=5")
	if resp.StatusCode != 502 || !strings.Contains(body, "pending") {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if n.Load() != 1 {
		t.Fatalf("server got %d", n.Load())
	}
	recs := h.led.records()
	if len(recs) != 1 || recs[0].State != ledger.Pending || resp.Header.Get(HeaderLedgerID) != recs[0].ID {
		t.Errorf("records %+v", recs)
	}
	resp, _ = do(t, c, "GET", "http://pay.example.test/status", "")
	if resp.StatusCode != 502 {
		t.Fatalf("GET got %d", resp.StatusCode)
	}
	if recs := h.led.records(); len(recs) != 2 || recs[1].State != ledger.Failed || recs[0].State != ledger.Pending {
		t.Errorf("records %+v", recs)
	}
}
