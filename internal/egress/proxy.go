package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/egress/ledger"
)

// Ledger is what the proxy needs of the effect ledger (*ledger.Ledger).
type Ledger interface {
	// Begin appends r; r.State "" means Pending. Terminal states get
	// Finished set; effect and opaque records are durable on return.
	Begin(sb string, r ledger.Record) (ledger.Record, error)
	Finish(sb, id string, state ledger.State, resp *ledger.Response, errText string) (ledger.Record, error)
	Match(sb string, id ledger.Identity) ledger.Match
}

// ProxyConfig configures a Proxy.
type ProxyConfig struct {
	Lookup func(src netip.Addr) (*Endpoint, bool) // the sandbox behind a source address
	Ledger Ledger
	// Dial dials the world (in the router netns); nil = a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// UpstreamRoots verify upstream TLS when inspecting; nil = system roots.
	UpstreamRoots *x509.CertPool
	Names         *Names // what each sandbox resolved through molt's DNS
	// BodyCap is how many request and response body bytes a record keeps
	// (default 1 MiB). Larger request bodies are sent but never replayed.
	BodyCap int64
	// Denied are ranges denied by default beyond DefaultDenied (the
	// host's addresses, molt's range).
	Denied []netip.Prefix
	// OrigDst gives a redirected connection's original destination; nil
	// = SO_ORIGINAL_DST.
	OrigDst func(c net.Conn) (netip.AddrPort, error)
	Log     *slog.Logger
}

// Proxy is molt's transparent egress proxy: the router namespace
// redirects every TCP connection of a sandbox to it. Per connection it
// applies the sandbox's policy, records the effect in the ledger before
// anything leaves, and answers from the ledger what a rolled-back
// sandbox already did.
//
// Lock order: Proxy.mu, then upstreams.mu; neither is held across I/O.
type Proxy struct {
	cfg    ProxyConfig
	log    *slog.Logger
	ctx    context.Context // cancelled by Close: ends dials and upstream requests
	cancel context.CancelFunc
	up     *upstreams
	wg     sync.WaitGroup // one per connection handler

	mu sync.Mutex
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	conns map[io.Closer]struct{} // client and upstream connections
	// +checklocks:mu
	listeners map[net.Listener]struct{}
	// +checklocks:mu
	inFlight map[string]*slots // by sandbox
	// +checklocks:mu
	maxInFlight int // HTTP requests a sandbox has in flight at once
}

// slots bound the HTTP requests of one sandbox in flight: each may hold
// up to BodyCap of request and of response in memory.
type slots struct {
	ch    chan struct{}
	users int // holders and waiters; the entry goes at zero
}

const (
	defaultBodyCap = 1 << 20
	maxHeaderBytes = 1 << 20
	// idleTimeout closes a client connection that sends no request, or
	// a ClientHello that does not arrive, for this long.
	idleTimeout  = 5 * time.Minute
	helloTimeout = 30 * time.Second
	dialTimeout  = 30 * time.Second
	// sniffTimeout is how long a connection to a port that is neither
	// HTTP nor 443 is watched for a ClientHello before it is piped raw
	// (protocols where the server speaks first wait this long once).
	sniffTimeout = 300 * time.Millisecond
	// defaultMaxInFlight bounds the memory one sandbox's requests hold
	// (each up to twice BodyCap); more wait for a slot.
	defaultMaxInFlight = 64
)

// NewProxy returns a proxy; Serve starts it.
func NewProxy(cfg ProxyConfig) *Proxy {
	if cfg.BodyCap <= 0 {
		cfg.BodyCap = defaultBodyCap
	}
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
		cfg.Dial = d.DialContext
	}
	if cfg.OrigDst == nil {
		cfg.OrigDst = originalDst
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		cfg:         cfg,
		log:         log,
		ctx:         ctx,
		cancel:      cancel,
		conns:       make(map[io.Closer]struct{}),
		listeners:   make(map[net.Listener]struct{}),
		inFlight:    make(map[string]*slots),
		maxInFlight: defaultMaxInFlight,
	}
	p.up = newUpstreams(p.dial, cfg.UpstreamRoots)
	return p
}

// Serve accepts connections on l until l or the proxy is closed.
func (p *Proxy) Serve(l net.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return net.ErrClosed
	}
	p.listeners[l] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.listeners, l)
		p.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of descriptors and the like: wait, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			p.log.Warn("egress proxy accept", "err", err)
			select {
			case <-time.After(backoff):
				continue
			case <-p.ctx.Done():
				return nil
			}
		}
		backoff = 0
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return nil
		}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.handle(c)
	}
}

// Close stops every Serve, closes live connections and waits for their
// handlers.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for l := range p.listeners {
		l.Close()
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.cancel()
	p.up.close()
	p.wg.Wait()
	p.up.close() // idle connections returned by handlers that just ended
	return nil
}

// track registers c to be closed by Close; false (and c closed) when the
// proxy is already closed.
func (p *Proxy) track(c io.Closer) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c io.Closer) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// acquire waits for one of sandbox sb's in-flight request slots.
func (p *Proxy) acquire(ctx context.Context, sb string) (release func(), err error) {
	p.mu.Lock()
	sl := p.inFlight[sb]
	if sl == nil {
		sl = &slots{ch: make(chan struct{}, p.maxInFlight)}
		p.inFlight[sb] = sl
	}
	sl.users++
	p.mu.Unlock()
	drop := func() {
		p.mu.Lock()
		if sl.users--; sl.users == 0 {
			delete(p.inFlight, sb)
		}
		p.mu.Unlock()
	}
	select {
	case sl.ch <- struct{}{}:
		return func() { <-sl.ch; drop() }, nil
	case <-ctx.Done():
		drop()
		return nil, ctx.Err()
	}
}

func (p *Proxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	return p.cfg.Dial(ctx, network, addr)
}

// session is one client connection and what it is judged by.
type session struct {
	p   *Proxy
	ep  *Endpoint
	c   net.Conn
	dst netip.AddrPort
}

func (p *Proxy) handle(c net.Conn) {
	defer p.wg.Done()
	defer p.untrack(c)
	defer c.Close()
	defer func() {
		// A bug must not take the daemon down with it; the sandbox
		// controls every byte that reached here.
		if r := recover(); r != nil {
			p.log.Error("egress proxy: panic", "panic", r)
			reset(c)
		}
	}()
	src, ok := addrPort(c.RemoteAddr())
	if !ok {
		return
	}
	ep, ok := p.cfg.Lookup(src.Addr().Unmap())
	if !ok || ep == nil {
		return
	}
	dst, err := p.cfg.OrigDst(c)
	if err != nil {
		p.log.Warn("egress proxy: original destination", "sandbox", ep.ID, "err", err)
		return
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	s := &session{p: p, ep: ep, c: c, dst: dst}
	if ok, why := ep.Policy.AllowAddr(dst.Addr(), p.cfg.Denied...); !ok {
		s.deny(ledger.Opaque, ledger.Identity{Proto: "tcp", Host: s.resolvedName(), Addr: dst.String()}, why)
		reset(c)
		return
	}
	switch port := dst.Port(); {
	case ep.Policy.IsHTTPPort(port):
		s.serveHTTP(c, "http", "")
	case port == 443:
		s.serveTLS(nil)
	default:
		s.serveOther()
	}
}

// resolvedName is the name the sandbox resolved to the destination
// address through molt's DNS, or "".
func (s *session) resolvedName() string {
	if s.p.cfg.Names == nil {
		return ""
	}
	return s.p.cfg.Names.Lookup(s.ep.ID, s.dst.Addr())
}

// allowName applies the domain policy to name ("" when the sandbox
// reached an address without a name).
func (s *session) allowName(name string) (bool, string) {
	if name == "" {
		if len(s.ep.Policy.AllowDomains) > 0 {
			return false, "address " + s.dst.Addr().String() + " has no name the sandbox resolved, and its egress allow list names domains"
		}
		return true, ""
	}
	if ok, why := s.ep.Policy.AllowDomain(name); !ok {
		return false, why
	}
	// With an allow list of domains, the address must be one molt's DNS
	// gave the sandbox for an allowed name (or one an allowed CIDR
	// names): a Host header or SNI of an allowed name on some other
	// address is the sandbox's word only.
	if len(s.ep.Policy.AllowDomains) > 0 && !s.explicitAddr() {
		r := s.resolvedName()
		if r == "" {
			return false, "address " + s.dst.Addr().String() + " was not resolved through molt's DNS, and the sandbox's egress allow list names domains"
		}
		if ok, _ := s.ep.Policy.AllowDomain(r); !ok {
			return false, "address " + s.dst.Addr().String() + " belongs to " + r + ", not to an allowed domain (the request named " + name + ")"
		}
	}
	return true, ""
}

// explicitAddr reports whether an allow CIDR of the policy names the
// destination address.
func (s *session) explicitAddr() bool {
	for _, c := range s.ep.Policy.AllowCIDRs {
		if c.Contains(s.dst.Addr().Unmap()) {
			return true
		}
	}
	return false
}

func (s *session) newRecord(kind ledger.Kind, state ledger.State, id ledger.Identity) ledger.Record {
	r := ledger.Record{Sandbox: s.ep.ID, Kind: kind, State: state, Request: id, Started: time.Now()}
	if s.ep.Turn != nil {
		r.Turn = s.ep.Turn()
	}
	if s.ep.Head != nil {
		r.Checkpoint = s.ep.Head()
	}
	return r
}

// deny records a refusal by the policy and returns the record's ID ("" when
// the ledger failed).
func (s *session) deny(kind ledger.Kind, id ledger.Identity, why string) string {
	r := s.newRecord(kind, ledger.Denied, id)
	r.Error = why
	return s.begin(r)
}

// begin appends a record and returns its ID, or "" when the ledger
// failed (logged).
func (s *session) begin(r ledger.Record) string {
	if s.p.cfg.Ledger == nil {
		// Nothing leaves unrecorded: without a ledger nothing leaves.
		s.p.log.Error("egress proxy: no ledger", "sandbox", s.ep.ID)
		return ""
	}
	got, err := s.p.cfg.Ledger.Begin(s.ep.ID, r)
	if err != nil {
		s.p.log.Error("egress proxy: ledger", "sandbox", s.ep.ID, "state", r.State, "err", err)
		return ""
	}
	return got.ID
}

func (s *session) finish(id string, state ledger.State, resp *ledger.Response, errText string) {
	if s.p.cfg.Ledger == nil {
		return
	}
	if _, err := s.p.cfg.Ledger.Finish(s.ep.ID, id, state, resp, errText); err != nil {
		s.p.log.Error("egress proxy: ledger finish", "sandbox", s.ep.ID, "record", id, "err", err)
	}
}

// serveOther handles a port that is neither HTTP nor 443: a ClientHello
// makes it TLS, anything else (or silence) raw TCP.
func (s *session) serveOther() {
	var b [1]byte
	s.c.SetReadDeadline(time.Now().Add(sniffTimeout))
	n, err := s.c.Read(b[:])
	s.c.SetReadDeadline(time.Time{})
	var ne net.Error
	switch {
	case n == 1 && b[0] == recordTypeHandshake:
		s.serveTLS(b[:1])
	case n == 1:
		s.serveRaw(b[:1])
	case err != nil && errors.As(err, &ne) && ne.Timeout():
		s.serveRaw(nil)
	}
	// Otherwise the client closed before sending anything.
}

// serveRaw pipes a TCP connection, recorded as one opaque record.
func (s *session) serveRaw(prefix []byte) {
	name := s.resolvedName()
	id := ledger.Identity{Proto: "tcp", Host: name, Addr: s.dst.String()}
	if ok, why := s.allowName(name); !ok {
		s.deny(ledger.Opaque, id, why)
		reset(s.c)
		return
	}
	s.tunnel(id, s.c, prefix)
}

// tunnel records an opaque connection, dials the destination and pipes
// client to it, prefix (bytes already read from the client) first.
func (s *session) tunnel(id ledger.Identity, client net.Conn, prefix []byte) {
	rid := s.begin(s.newRecord(ledger.Opaque, "", id))
	if rid == "" {
		reset(s.c)
		return
	}
	up, err := s.p.dial(s.p.ctx, "tcp", s.dst.String())
	if err != nil {
		s.finish(rid, ledger.Failed, nil, "dial: "+err.Error())
		reset(s.c)
		return
	}
	if !s.p.track(up) {
		s.finish(rid, ledger.Failed, nil, "egress proxy closed")
		return
	}
	defer s.p.untrack(up)
	defer up.Close()
	var out int64
	if len(prefix) > 0 {
		n, err := up.Write(prefix)
		out += int64(n)
		if err != nil {
			s.finish(rid, ledger.Completed, &ledger.Response{BytesOut: out}, "write: "+err.Error())
			reset(s.c)
			return
		}
	}
	o, in, perr := pipe(client, up)
	resp := &ledger.Response{BytesOut: out + o, BytesIn: in}
	errText := ""
	if perr != nil {
		errText = perr.Error()
	}
	s.finish(rid, ledger.Completed, resp, errText)
}

// pipe copies a to b and b to a until both directions end, passing a
// half-close on. It returns the bytes each way and the first error that
// was not an orderly end.
func pipe(a, b net.Conn) (aToB, bToA int64, err error) {
	errc := make(chan error, 1)
	go func() {
		var err error
		aToB, err = io.Copy(b, a)
		errc <- endDirection(b, a, err)
	}()
	bToA, err2 := io.Copy(a, b)
	err2 = endDirection(a, b, err2)
	err1 := <-errc
	return aToB, bToA, errors.Join(err1, err2)
}

// endDirection ends one copy's direction: an orderly end half-closes
// the writer; an error closes both, which also unblocks the other copy.
func endDirection(w, r net.Conn, err error) error {
	if err == nil {
		if cw, ok := w.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return nil
		}
	}
	w.Close()
	r.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil // the other direction's error closed it
	}
	return err
}

// reset closes c with a TCP RST, so the sandbox sees "connection reset"
// rather than an orderly end it could mistake for an answer.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func addrPort(a net.Addr) (netip.AddrPort, bool) {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort(), true
	}
	ap, err := netip.ParseAddrPort(a.String())
	return ap, err == nil
}

// prefixConn is a connection whose first bytes were already read.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

func (c *prefixConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
