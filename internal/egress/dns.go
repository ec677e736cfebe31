package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/netutil"

	"github.com/molt-sh/molt/internal/egress/ledger"
)

// DNSConfig configures the DNS server sandboxes resolve through.
type DNSConfig struct {
	// Lookup finds the sandbox behind a source address; queries from
	// any other address are refused.
	Lookup func(src netip.Addr) (*Endpoint, bool)
	// Upstream are the resolvers ("ip:port") queries are forwarded to,
	// tried in order.
	Upstream []string
	// Dial connects to an upstream; nil is a net.Dialer's.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Names learns which name each sandbox resolved to which address.
	// May be nil.
	Names *Names
	// Record is called with the finished record of each query (Kind
	// Read, Proto "dns", Method the query type, Host the name), before
	// the sandbox gets its answer. May be nil.
	Record func(ep *Endpoint, r ledger.Record)
	// Timeout bounds each exchange with an upstream; 0 is 2 s.
	Timeout time.Duration
	Log     *slog.Logger
}

// Limits on what sandboxes can make the server do.
const (
	dnsTimeout       = 2 * time.Second
	dnsMaxInFlight   = 256  // upstream exchanges at once, all sandboxes
	dnsMaxPerSandbox = 32   // of which one sandbox's
	dnsMaxTCPConns   = 256  // TCP connections from sandboxes at once
	dnsMaxChain      = 256  // answer records examined for CNAME chains
	dnsUpstreamBuf   = 1232 // EDNS buffer asked of upstreams (DNS flag day 2020)
	dnsMaxAnswers    = 64   // answers kept in a ledger record
)

// DNS is molt's resolver for sandboxes: it answers each sandbox by its
// egress policy (a denied name does not exist), forwards the rest to
// the upstream resolvers, remembers what each sandbox resolved (Names)
// so the proxy can judge connections by name, and records every query.
// Sandboxes are IPv4-only: AAAA queries get an empty answer.
type DNS struct {
	cfg    DNSConfig
	log    *slog.Logger
	ctx    context.Context // cancelled by Close: ends upstream exchanges
	cancel context.CancelFunc
	sem    chan struct{} // one token per upstream exchange in flight

	mu sync.Mutex
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	servers []*dnsServer
	// +checklocks:mu
	inFlight map[string]int // upstream exchanges per sandbox
}

type dnsServer struct {
	srv     *dns.Server
	started chan struct{} // closed once srv serves (Shutdown works)
	exited  chan struct{} // closed when srv stopped
}

// NewDNS returns a DNS server; serve it with ServeUDP and ServeTCP.
func NewDNS(cfg DNSConfig) *DNS {
	if cfg.Timeout <= 0 {
		cfg.Timeout = dnsTimeout
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &DNS{cfg: cfg, log: log, ctx: ctx, cancel: cancel, sem: make(chan struct{}, dnsMaxInFlight), inFlight: map[string]int{}}
}

// ServeUDP answers queries arriving on pc until Close.
func (d *DNS) ServeUDP(pc net.PacketConn) error {
	return d.serve(&dns.Server{PacketConn: pc, Handler: d})
}

// ServeTCP answers queries on connections accepted from l until Close.
func (d *DNS) ServeTCP(l net.Listener) error {
	return d.serve(&dns.Server{Listener: netutil.LimitListener(l, dnsMaxTCPConns), Handler: d})
}

func (d *DNS) serve(srv *dns.Server) error {
	s := &dnsServer{srv: srv, started: make(chan struct{}), exited: make(chan struct{})}
	srv.NotifyStartedFunc = func() { close(s.started) }
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return net.ErrClosed
	}
	d.servers = append(d.servers, s)
	d.mu.Unlock()
	defer close(s.exited)
	return srv.ActivateAndServe()
}

// Close stops serving, closing the connections given to ServeUDP and
// ServeTCP, and waits for queries in flight to end.
func (d *DNS) Close() error {
	d.mu.Lock()
	d.closed = true
	servers := d.servers
	d.servers = nil
	d.mu.Unlock()
	d.cancel()
	var errs []error
	for _, s := range servers {
		select {
		case <-s.started:
			if err := s.srv.Shutdown(); err != nil {
				errs = append(errs, err)
			}
		case <-s.exited:
		}
	}
	return errors.Join(errs...)
}

// query is one query being answered.
type query struct {
	w     dns.ResponseWriter
	req   *dns.Msg
	reply *dns.Msg
	ep    *Endpoint
	rec   ledger.Record
}

// ServeDNS answers one query.
func (d *DNS) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	reply := new(dns.Msg)
	reply.SetReply(req)
	reply.RecursionAvailable = true
	src := addrOf(w.RemoteAddr())
	var ep *Endpoint
	ok := false
	if d.cfg.Lookup != nil && src.IsValid() {
		ep, ok = d.cfg.Lookup(src)
	}
	if !ok || ep == nil {
		reply.Rcode = dns.RcodeRefused
		w.WriteMsg(reply)
		return
	}
	// The server's accept function already wants one question and
	// opcode QUERY or NOTIFY.
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		reply.Rcode = dns.RcodeNotImplemented
		if len(req.Question) != 1 {
			reply.Rcode = dns.RcodeFormatError
		}
		w.WriteMsg(reply)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	qt := dns.TypeToString[q.Qtype]
	if qt == "" {
		qt = fmt.Sprintf("TYPE%d", q.Qtype)
	}
	x := &query{w: w, req: req, reply: reply, ep: ep, rec: ledger.Record{
		Sandbox: ep.ID,
		Kind:    ledger.Read,
		Request: ledger.Identity{Proto: "dns", Method: qt, Host: name, Addr: w.LocalAddr().String()},
		Started: time.Now(),
	}}
	if ep.Turn != nil {
		x.rec.Turn = ep.Turn()
	}
	if ep.Head != nil {
		x.rec.Checkpoint = ep.Head()
	}

	if q.Qclass != dns.ClassINET {
		d.finish(x, dns.RcodeRefused, ledger.Denied, fmt.Sprintf("DNS class %s is not served", dns.ClassToString[q.Qclass]))
		return
	}
	switch q.Qtype {
	case dns.TypeAXFR, dns.TypeIXFR, dns.TypeMAILA, dns.TypeMAILB:
		d.finish(x, dns.RcodeNotImplemented, ledger.Denied, "DNS query type "+qt+" is not served")
		return
	}
	if allowed, why := ep.Policy.AllowDomain(name); !allowed {
		d.finish(x, dns.RcodeNameError, ledger.Denied, why)
		return
	}
	if q.Qtype == dns.TypeAAAA {
		d.finish(x, dns.RcodeSuccess, ledger.Completed, "")
		return
	}
	resp, err := d.forward(ep.ID, q)
	if err != nil {
		d.log.Debug("dns forward failed", "sandbox", ep.ID, "name", name, "type", qt, "err", err)
		d.finish(x, dns.RcodeServerFailure, ledger.Failed, err.Error())
		return
	}
	reply.Answer, reply.Ns = resp.Answer, resp.Ns
	if d.cfg.Names != nil {
		if addrs, ttl := chainAddrs(q.Name, resp.Answer); len(addrs) > 0 {
			d.cfg.Names.Add(ep.ID, name, addrs, ttl)
		}
	}
	d.finish(x, resp.Rcode, ledger.Completed, "")
}

// finish records x and sends its reply with rcode.
func (d *DNS) finish(x *query, rcode int, state ledger.State, why string) {
	x.reply.Rcode = rcode
	x.rec.State, x.rec.Error, x.rec.Finished = state, why, time.Now()
	if state == ledger.Completed {
		resp := &ledger.Response{}
		for _, rr := range x.reply.Answer {
			switch rr.(type) {
			case *dns.A, *dns.AAAA, *dns.CNAME:
				if len(resp.Answers) < dnsMaxAnswers {
					resp.Answers = append(resp.Answers, strings.ReplaceAll(rr.String(), "\t", " "))
				}
			}
		}
		x.rec.Response = resp
	}
	if d.cfg.Record != nil {
		d.cfg.Record(x.ep, x.rec)
	}
	// The answer fits what the sandbox can take: 512 bytes over UDP, or
	// its EDNS buffer (at most the size asked of upstreams); the rest is
	// marked truncated so it retries over TCP.
	size := dns.MaxMsgSize
	if _, udp := x.w.RemoteAddr().(*net.UDPAddr); udp {
		size = dns.MinMsgSize
	}
	if opt := x.req.IsEdns0(); opt != nil {
		x.reply.SetEdns0(dnsUpstreamBuf, false)
		if size != dns.MaxMsgSize {
			size = min(max(int(opt.UDPSize()), dns.MinMsgSize), dnsUpstreamBuf)
		}
	}
	x.reply.Compress = true
	x.reply.Truncate(size)
	x.w.WriteMsg(x.reply)
}

var (
	errBusy        = errors.New("too many DNS queries in flight")
	errBusySandbox = errors.New("too many DNS queries of this sandbox in flight")
)

// forward asks the upstreams q for sandbox sb, in a fresh query with
// nothing of the sandbox's but the question.
func (d *DNS) forward(sb string, q dns.Question) (*dns.Msg, error) {
	d.mu.Lock()
	if d.inFlight[sb] >= dnsMaxPerSandbox {
		d.mu.Unlock()
		return nil, errBusySandbox
	}
	d.inFlight[sb]++
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		if d.inFlight[sb]--; d.inFlight[sb] == 0 {
			delete(d.inFlight, sb)
		}
		d.mu.Unlock()
	}()
	select {
	case d.sem <- struct{}{}:
		defer func() { <-d.sem }()
	default:
		return nil, errBusy
	}
	if len(d.cfg.Upstream) == 0 {
		return nil, errors.New("no upstream resolver")
	}
	m := new(dns.Msg)
	m.Id = dns.Id()
	m.RecursionDesired = true
	m.Question = []dns.Question{q}
	m.SetEdns0(dnsUpstreamBuf, false)
	var errs []error
	for _, up := range d.cfg.Upstream {
		r, err := d.exchange("udp", up, m)
		if err == nil && r.Truncated {
			r, err = d.exchange("tcp", up, m)
		}
		if err == nil && r.Rcode != dns.RcodeSuccess && r.Rcode != dns.RcodeNameError {
			err = fmt.Errorf("answered %s", dns.RcodeToString[r.Rcode])
		}
		if err == nil {
			return r, nil
		}
		errs = append(errs, fmt.Errorf("upstream %s: %w", up, err))
	}
	return nil, errors.Join(errs...)
}

func (d *DNS) exchange(network, addr string, m *dns.Msg) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Timeout)
	defer cancel()
	conn, err := d.cfg.Dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	co := &dns.Conn{Conn: conn}
	defer co.Close()
	// The exchange only reads ctx's deadline; Close cancels ctx and
	// must not wait out the timeout.
	defer context.AfterFunc(ctx, func() { conn.Close() })()
	r, _, err := (&dns.Client{Net: network, Timeout: d.cfg.Timeout}).ExchangeWithConnContext(ctx, m, co)
	if err != nil {
		return nil, err
	}
	if !r.Response || len(r.Question) != 1 || r.Question[0].Qtype != m.Question[0].Qtype ||
		r.Question[0].Qclass != m.Question[0].Qclass || !strings.EqualFold(r.Question[0].Name, m.Question[0].Name) {
		return nil, errors.New("answer to another question")
	}
	return r, nil
}

// chainAddrs returns the A addresses qname resolves to in answers,
// through CNAME chains, and the smallest TTL on the way.
func chainAddrs(qname string, answers []dns.RR) ([]netip.Addr, time.Duration) {
	if len(answers) > dnsMaxChain {
		answers = answers[:dnsMaxChain]
	}
	names := map[string]bool{strings.ToLower(dns.Fqdn(qname)): true}
	ttl := ^uint32(0)
	// Each pass adds at least one link, so len(answers) passes suffice.
	for range answers {
		grew := false
		for _, rr := range answers {
			c, ok := rr.(*dns.CNAME)
			if !ok || !names[strings.ToLower(c.Hdr.Name)] || names[strings.ToLower(c.Target)] {
				continue
			}
			names[strings.ToLower(c.Target)] = true
			ttl = min(ttl, c.Hdr.Ttl)
			grew = true
		}
		if !grew {
			break
		}
	}
	var addrs []netip.Addr
	for _, rr := range answers {
		a, ok := rr.(*dns.A)
		if !ok || !names[strings.ToLower(a.Hdr.Name)] {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.A); ok {
			addrs = append(addrs, ip.Unmap())
			ttl = min(ttl, a.Hdr.Ttl)
		}
	}
	return addrs, time.Duration(ttl) * time.Second
}

func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
