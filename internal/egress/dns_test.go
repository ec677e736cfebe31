package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/egress/netlab"
	"github.com/molt-sh/molt/internal/testutil"
)

// fakeUpstream is a resolver on loopback: www.example.com is a CNAME
// to cdn.example.net (93.184.216.34), big.example.com has 60 addresses
// and is truncated over UDP, nx.example.com does not exist.
type fakeUpstream struct {
	addr    string
	queries atomic.Int64
	stop    chan struct{} // closed at the test's end: slow answers end
}

func startUpstream(t testing.TB) *fakeUpstream {
	t.Helper()
	u := &fakeUpstream{stop: make(chan struct{})}
	// The same port for UDP and TCP: a UDP port whose TCP twin some
	// other socket holds is tried again with another.
	var pc net.PacketConn
	var ln net.Listener
	for try := 0; ; try++ {
		var err error
		if pc, err = net.ListenPacket("udp4", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		u.addr = pc.LocalAddr().String()
		if ln, err = net.Listen("tcp4", u.addr); err == nil {
			break
		}
		pc.Close()
		if try == 20 {
			t.Fatal(err)
		}
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		u.queries.Add(1)
		m := new(dns.Msg)
		m.SetReply(req)
		q := req.Question[0]
		rr := func(s string) dns.RR {
			r, err := dns.NewRR(s)
			if err != nil {
				panic(err)
			}
			return r
		}
		switch strings.ToLower(q.Name) {
		case "www.example.com.":
			m.Answer = []dns.RR{rr(q.Name + " 300 IN CNAME cdn.example.net."), rr("cdn.example.net. 120 IN A 93.184.216.34")}
		case "big.example.com.":
			if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
				m.Truncated = true
				break
			}
			for i := range 60 {
				m.Answer = append(m.Answer, rr(fmt.Sprintf("big.example.com. 60 IN A 198.18.0.%d", i+1)))
			}
		case "nx.example.com.":
			m.Rcode = dns.RcodeNameError
		case "slow.example.com.":
			<-u.stop // longer than the server's timeout
			return
		default:
			m.Answer = []dns.RR{rr(q.Name + " 60 IN A 93.184.216.35")}
		}
		w.WriteMsg(m)
	})
	for _, s := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go s.ActivateAndServe()
		<-started
		t.Cleanup(func() { s.Shutdown() })
	}
	t.Cleanup(func() { close(u.stop) })
	return u
}

type dnsHarness struct {
	d     *DNS
	ep    *Endpoint
	names *Names
	udp   string
	tcp   string

	mu   sync.Mutex
	recs []ledger.Record
}

func (h *dnsHarness) records() []ledger.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]ledger.Record(nil), h.recs...)
}

func (h *dnsHarness) last(t *testing.T) ledger.Record {
	t.Helper()
	r := h.records()
	if len(r) == 0 {
		t.Fatal("no ledger record")
	}
	return r[len(r)-1]
}

// startDNS serves molt's DNS on loopback with 127.0.0.1 as the sandbox
// (known reports whether Lookup knows it).
func startDNS(t *testing.T, upstream []string, policy Policy, known bool) *dnsHarness {
	t.Helper()
	return startDNSWith(t, upstream, policy, known, nil)
}

// startDNSDial is startDNS with upstreams reached through dial.
func startDNSDial(t *testing.T, upstream []string, policy Policy, dial func(context.Context, string, string) (net.Conn, error)) *dnsHarness {
	t.Helper()
	return startDNSWith(t, upstream, policy, true, dial)
}

func startDNSWith(t testing.TB, upstream []string, policy Policy, known bool, dial func(context.Context, string, string) (net.Conn, error)) *dnsHarness {
	t.Helper()
	if err := policy.Validate(); err != nil {
		t.Fatal(err)
	}
	h := &dnsHarness{names: &Names{}}
	h.ep = &Endpoint{ID: "sb1", Addr: netip.MustParseAddr("127.0.0.1"), Policy: policy,
		Turn: func() int { return 7 }, Head: func() string { return "ck1" }}
	h.d = NewDNS(DNSConfig{
		Lookup: func(src netip.Addr) (*Endpoint, bool) {
			if known && src == h.ep.Addr {
				return h.ep, true
			}
			return nil, false
		},
		Upstream: upstream,
		Dial:     dial,
		Names:    h.names,
		Timeout:  300 * time.Millisecond,
		Record: func(ep *Endpoint, r ledger.Record) {
			if ep != h.ep {
				t.Errorf("record for endpoint %v", ep)
			}
			h.mu.Lock()
			h.recs = append(h.recs, r)
			h.mu.Unlock()
		},
	})
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.udp, h.tcp = pc.LocalAddr().String(), ln.Addr().String()
	var wg sync.WaitGroup
	wg.Go(func() { h.d.ServeUDP(pc) })
	wg.Go(func() { h.d.ServeTCP(ln) })
	t.Cleanup(func() {
		if err := h.d.Close(); err != nil {
			t.Error(err)
		}
		wg.Wait()
	})
	return h
}

// ask queries the server over network ("udp" or "tcp"), retrying while
// the server is not yet serving.
func (h *dnsHarness) ask(t *testing.T, network, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	addr := h.udp
	if network == "tcp" {
		addr = h.tcp
	}
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s %s: %v", network, name, dns.TypeToString[qtype], err)
	}
	return r
}

func TestDNSAllowed(t *testing.T) {
	up := startUpstream(t)
	h := startDNS(t, []string{up.addr}, Policy{AllowDomains: []string{"example.com"}}, true)
	r := h.ask(t, "udp", "WWW.example.com", dns.TypeA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
		t.Fatalf("answer %v", r)
	}
	if got := h.names.Lookup("sb1", netip.MustParseAddr("93.184.216.34")); got != "www.example.com" {
		t.Errorf("Names has %q for the CNAME's address, want the asked name", got)
	}
	rec := h.last(t)
	if rec.Kind != ledger.Read || rec.State != ledger.Completed || rec.Request.Proto != "dns" ||
		rec.Request.Host != "www.example.com" || rec.Request.Method != "A" || rec.Sandbox != "sb1" ||
		rec.Turn != 7 || rec.Checkpoint != "ck1" || rec.Finished.IsZero() || rec.Response == nil {
		t.Fatalf("record %+v", rec)
	}
	if a := rec.Response.Answers; len(a) != 2 || !strings.Contains(a[0], "CNAME cdn.example.net.") || !strings.Contains(a[1], "93.184.216.34") {
		t.Errorf("answers %q", a)
	}

	// Truncated upstream: retried over TCP; the sandbox gets what fits
	// in 512 bytes over UDP (marked truncated) and all of it over TCP.
	if r := h.ask(t, "udp", "big.example.com", dns.TypeA); !r.Truncated {
		t.Errorf("60 addresses over plain UDP not truncated: %d answers", len(r.Answer))
	}
	if r := h.ask(t, "tcp", "big.example.com", dns.TypeA); len(r.Answer) != 60 || r.Truncated {
		t.Errorf("over TCP: %d answers, truncated %v", len(r.Answer), r.Truncated)
	}
	if got := h.names.Lookup("sb1", netip.MustParseAddr("198.18.0.60")); got != "big.example.com" {
		t.Errorf("Names for the 60th address: %q", got)
	}

	// An upstream NXDOMAIN is passed on, as a completed read.
	if r := h.ask(t, "udp", "nx.example.com", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("nx: %v", r)
	}
	if rec := h.last(t); rec.State != ledger.Completed || rec.Request.Host != "nx.example.com" {
		t.Errorf("nx record %+v", rec)
	}
}

func TestDNSDenied(t *testing.T) {
	up := startUpstream(t)
	h := startDNS(t, []string{up.addr}, Policy{DenyDomains: []string{"evil.example"}}, true)
	for _, network := range []string{"udp", "tcp"} {
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
			r := h.ask(t, network, "api.EVIL.example", qt)
			if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
				t.Errorf("%s %s: %v", network, dns.TypeToString[qt], r)
			}
			rec := h.last(t)
			if rec.State != ledger.Denied || rec.Request.Host != "api.evil.example" || !strings.Contains(rec.Error, "evil.example is denied") {
				t.Errorf("record %+v", rec)
			}
		}
	}
	if n := up.queries.Load(); n != 0 {
		t.Errorf("upstream asked %d times for denied names", n)
	}
	// Another name is fine.
	if r := h.ask(t, "udp", "ok.example.org", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("allowed name: %v", r)
	}
}

func TestDNSAAAAEmpty(t *testing.T) {
	up := startUpstream(t)
	h := startDNS(t, []string{up.addr}, Policy{}, true)
	r := h.ask(t, "udp", "www.example.com", dns.TypeAAAA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Errorf("AAAA: %v", r)
	}
	if n := up.queries.Load(); n != 0 {
		t.Errorf("upstream asked %d times for AAAA", n)
	}
	if rec := h.last(t); rec.State != ledger.Completed || rec.Request.Method != "AAAA" {
		t.Errorf("record %+v", rec)
	}
}

func TestDNSUnknownSource(t *testing.T) {
	up := startUpstream(t)
	h := startDNS(t, []string{up.addr}, Policy{}, false)
	for _, network := range []string{"udp", "tcp"} {
		if r := h.ask(t, network, "www.example.com", dns.TypeA); r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
			t.Errorf("%s: %v", network, r)
		}
	}
	if n := up.queries.Load(); n != 0 || len(h.records()) != 0 {
		t.Errorf("unknown source: %d upstream queries, %d records", n, len(h.records()))
	}
}

func TestDNSUpstreamDown(t *testing.T) {
	// A port nothing listens on (refused at once) and one that never
	// answers (times out).
	closed, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.LocalAddr().String()
	closed.Close()
	silent, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	h := startDNS(t, []string{closedAddr, silent.LocalAddr().String()}, Policy{}, true)
	start := time.Now()
	r := h.ask(t, "udp", "www.example.com", dns.TypeA)
	if r.Rcode != dns.RcodeServerFailure {
		t.Errorf("rcode %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("SERVFAIL after %v", d)
	}
	rec := h.last(t)
	if rec.State != ledger.Failed || !strings.Contains(rec.Error, closedAddr) || rec.Request.Host != "www.example.com" {
		t.Errorf("record %+v", rec)
	}

	// A working upstream after the dead ones answers.
	up := startUpstream(t)
	h = startDNS(t, []string{closedAddr, up.addr}, Policy{}, true)
	if r := h.ask(t, "udp", "www.example.com", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
		t.Errorf("with a live second upstream: %v", r)
	}
}

func TestDNSHostileQueries(t *testing.T) {
	up := startUpstream(t)
	h := startDNS(t, []string{up.addr}, Policy{}, true)
	c, err := net.Dial("udp", h.udp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ask := func(m *dns.Msg) *dns.Msg {
		t.Helper()
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		c.Write(b)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4096)
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:n]); err != nil {
			t.Fatal(err)
		}
		return r
	}
	two := new(dns.Msg)
	two.SetQuestion("a.example.com.", dns.TypeA)
	two.Question = append(two.Question, dns.Question{Name: "b.example.com.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	if r := ask(two); r.Rcode != dns.RcodeFormatError {
		t.Errorf("two questions: %s", dns.RcodeToString[r.Rcode])
	}
	notify := new(dns.Msg)
	notify.SetNotify("example.com.")
	if r := ask(notify); r.Rcode != dns.RcodeNotImplemented {
		t.Errorf("notify: %s", dns.RcodeToString[r.Rcode])
	}
	chaos := new(dns.Msg)
	chaos.SetQuestion("version.bind.", dns.TypeTXT)
	chaos.Question[0].Qclass = dns.ClassCHAOS
	if r := ask(chaos); r.Rcode != dns.RcodeRefused {
		t.Errorf("class CHAOS: %s", dns.RcodeToString[r.Rcode])
	}
	for _, qt := range []uint16{dns.TypeAXFR, dns.TypeIXFR} {
		if r := h.ask(t, "tcp", "example.com", qt); r.Rcode != dns.RcodeNotImplemented {
			t.Errorf("%s: %s", dns.TypeToString[qt], dns.RcodeToString[r.Rcode])
		}
		if rec := h.last(t); rec.State != ledger.Denied || rec.Request.Method != dns.TypeToString[qt] {
			t.Errorf("%s record %+v", dns.TypeToString[qt], rec)
		}
	}
	if n := up.queries.Load(); n != 0 {
		t.Errorf("upstream asked %d times", n)
	}
	// Garbage gets no answer and does not stop the server.
	c.Write([]byte("\x00\x01garbage"))
	if r := h.ask(t, "udp", "fine.example.com", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Errorf("after garbage: %v", r)
	}
}

// TestDNSThroughLab forwards to the test internet's resolver, dialed
// inside the lab as molt's uplink would.
func TestDNSThroughLab(t *testing.T) {
	testutil.RequireRoot(t)
	lab, err := netlab.Start(netlab.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()
	h := startDNSDial(t, []string{lab.DNSAddr().String()}, Policy{AllowDomains: []string{netlab.Zone}}, lab.DialContext)
	for _, network := range []string{"udp", "tcp"} {
		r := h.ask(t, network, netlab.AliasName, dns.TypeA)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
			t.Fatalf("%s %s: %v", network, netlab.AliasName, r)
		}
	}
	if got := h.names.Lookup("sb1", netip.MustParseAddr(netlab.WebIP)); got != netlab.AliasName {
		t.Errorf("Names has %q for %s", got, netlab.WebIP)
	}
	if r := h.ask(t, "udp", "missing."+netlab.Zone, dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("missing name: %v", r)
	}
	if r := h.ask(t, "udp", "example.com", dns.TypeA); r.Rcode != dns.RcodeNameError || h.last(t).State != ledger.Denied {
		t.Errorf("name outside the allow list: %v", r)
	}
}

// BenchmarkDNS compares a query through molt's DNS with one asked of
// the upstream directly (both on loopback, UDP).
func BenchmarkDNS(b *testing.B) {
	for _, via := range []string{"molt", "direct"} {
		b.Run(via, func(b *testing.B) {
			up := startUpstream(b)
			addr := up.addr
			if via == "molt" {
				addr = startDNSWith(b, []string{up.addr}, Policy{}, true, nil).udp
			}
			c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
			m := new(dns.Msg)
			m.SetQuestion("www.example.com.", dns.TypeA)
			for b.Loop() {
				if _, _, err := c.Exchange(m, addr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestDNSPerSandboxLimit: a sandbox with dnsMaxPerSandbox queries
// waiting on a slow upstream gets SERVFAIL at once for more, and
// another sandbox is still answered.
func TestDNSPerSandboxLimit(t *testing.T) {
	up := startUpstream(t)
	eps := map[netip.Addr]*Endpoint{
		netip.MustParseAddr("127.0.0.1"): {ID: "greedy"},
		netip.MustParseAddr("127.0.0.2"): {ID: "other"},
	}
	var failed atomic.Int64
	d := NewDNS(DNSConfig{
		Lookup:   func(src netip.Addr) (*Endpoint, bool) { ep, ok := eps[src]; return ep, ok },
		Upstream: []string{up.addr},
		Timeout:  10 * time.Second,
		Record: func(ep *Endpoint, r ledger.Record) {
			if ep.ID == "greedy" && r.State == ledger.Failed && strings.Contains(r.Error, "in flight") {
				failed.Add(1)
			}
		},
	})
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go d.ServeUDP(pc)

	c, err := net.Dial("udp4", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = dnsMaxPerSandbox + 8
	for i := range n {
		m := new(dns.Msg)
		m.SetQuestion("slow.example.com.", dns.TypeA)
		m.Id = uint16(i + 1)
		b, _ := m.Pack()
		c.Write(b)
	}
	// The 8 beyond the limit are refused long before the upstream's
	// timeout ends the others.
	c.SetReadDeadline(time.Now().Add(time.Second))
	fast := 0
	buf := make([]byte, 512)
	for {
		k, err := c.Read(buf)
		if err != nil {
			break
		}
		r := new(dns.Msg)
		if r.Unpack(buf[:k]) == nil && r.Rcode == dns.RcodeServerFailure {
			fast++
		}
	}
	if fast != n-dnsMaxPerSandbox || failed.Load() != int64(fast) {
		t.Errorf("%d SERVFAILs within 1 s, %d recorded as over the limit; want %d", fast, failed.Load(), n-dnsMaxPerSandbox)
	}
	// Another sandbox is answered meanwhile.
	other, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.2:0")), net.UDPAddrFromAddrPort(netip.MustParseAddrPort(pc.LocalAddr().String())))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	co := &dns.Conn{Conn: other}
	r, _, err := (&dns.Client{Timeout: time.Second}).ExchangeWithConn(m, co)
	if err != nil || r.Rcode != dns.RcodeSuccess {
		t.Errorf("the other sandbox: %v %v", r, err)
	}
	// Close ends the exchanges still waiting, not after their timeout.
	start := time.Now()
	if err := d.Close(); err != nil {
		t.Error(err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("Close took %v with exchanges in flight", el)
	}
}

// TestNamesExportImport: what a sandbox resolved moves to another
// host's memory (a migration): each entry for at most minNameTTL there,
// expired ones not at all, and what the sandbox resolved there stays.
func TestNamesExportImport(t *testing.T) {
	var src, dst Names
	a, b, c := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	src.Add("sb", "Pypi.org.", []netip.Addr{a}, time.Hour)
	src.Add("sb", "files.example", []netip.Addr{b}, 0)
	src.Add("other", "x.example", []netip.Addr{c}, time.Hour)
	out := src.Export("sb")
	if len(out) != 2 || out[0].Addr != a || out[0].Name != "pypi.org" || out[1].Addr != b {
		t.Fatalf("export: %+v", out)
	}
	dst.Add("sb", "here.example", []netip.Addr{b}, time.Hour)
	expired := Resolved{Name: "old.example", Addr: c, Expires: time.Now().Add(-time.Second)}
	dst.Import("sb", append(out, expired))
	if got := dst.Lookup("sb", a); got != "pypi.org" {
		t.Errorf("imported name: %q", got)
	}
	if got := dst.Lookup("sb", b); got != "here.example" {
		t.Errorf("what the sandbox resolved here: %q, want it kept", got)
	}
	if got := dst.Lookup("sb", c); got != "" {
		t.Errorf("an expired entry was imported: %q", got)
	}
	for _, r := range dst.Export("sb") {
		if r.Addr == a && r.Expires.After(time.Now().Add(minNameTTL+time.Second)) {
			t.Errorf("%s kept until %v, past minNameTTL", r.Name, r.Expires)
		}
	}
	if dst.Lookup("other", c) != "" {
		t.Error("another sandbox's name")
	}
}
