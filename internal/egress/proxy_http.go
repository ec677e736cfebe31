package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/molt-sh/molt/internal/egress/ledger"
)

// Headers the proxy adds to the responses the sandbox gets.
const (
	HeaderLedgerID = "Molt-Ledger-Id" // the record of this request
	HeaderReplayed = "Molt-Replayed"  // the orphan the response was replayed from
)

// hopHeaders are per connection and not forwarded (RFC 9110 7.6.1).
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopHeaders(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// serveHTTP runs the HTTP/1.1 request loop on a client connection (c
// may be the sandbox's side of terminated TLS): policy, ledger, replay
// or forward, one request at a time.
func (s *session) serveHTTP(c net.Conn, scheme, sni string) {
	// Header bytes are limited as net/http's server does: the limit
	// applies while the request head is read and is lifted for the body.
	lr := &io.LimitedReader{R: c, N: maxHeaderBytes}
	br := bufio.NewReaderSize(lr, 16<<10)
	bw := bufio.NewWriterSize(c, 16<<10)
	for {
		lr.N = maxHeaderBytes
		c.SetReadDeadline(time.Now().Add(idleTimeout))
		req, err := http.ReadRequest(br)
		if err != nil {
			if lr.N == 0 {
				io.WriteString(c, "HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
			} else if !errors.Is(err, io.EOF) && !isNetErr(err) {
				io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
			}
			return
		}
		lr.N = math.MaxInt64
		c.SetReadDeadline(time.Time{})
		keep := s.serveRequest(c, br, bw, req, scheme, sni)
		if err := bw.Flush(); err != nil || !keep {
			return
		}
	}
}

func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

// serveRequest answers one request and reports whether the connection
// can carry another.
func (s *session) serveRequest(c net.Conn, br *bufio.Reader, bw *bufio.Writer, req *http.Request, scheme, sni string) bool {
	bodyCap := s.p.cfg.BodyCap
	host := req.Host
	if host == "" {
		host = s.dst.String()
	}
	name, kind, ok := s.gate(bw, req, scheme, host)
	if !ok {
		return false // the body is unread
	}
	release, err := s.p.acquire(s.p.ctx, s.ep.ID)
	if err != nil {
		return false
	}
	defer release()
	if req.Header.Get("Expect") == "100-continue" && req.ProtoAtLeast(1, 1) {
		io.WriteString(bw, "HTTP/1.1 100 Continue\r\n\r\n")
		if bw.Flush() != nil {
			return false
		}
	}
	req.Header.Del("Expect")

	// The body is read whole up to the cap so the identity covers it;
	// beyond the cap it streams to the world and the record has no body
	// hash (such a request is never matched or replayed).
	body, err := io.ReadAll(io.LimitReader(req.Body, bodyCap+1))
	if err != nil {
		return false
	}
	streamed := int64(len(body)) > bodyCap
	var bodyHash hash.Hash
	var upBody io.Reader
	if streamed {
		bodyHash = sha256.New()
		upBody = io.TeeReader(io.MultiReader(bytes.NewReader(body), req.Body), bodyHash)
		body = nil
	}
	id := ledger.Canon{IgnoreHeaders: s.ep.Policy.IgnoreHeaders, IgnoreJSONFields: s.ep.Policy.IgnoreJSONFields}.
		HTTP(scheme, req.Method, host, req.URL, req.Header, body)
	if streamed {
		id.BodyHash = ""
	}
	id.Addr = s.dst.String()
	if id.Host == "" {
		id.Host = name
	}
	rec := s.newRecord(kind, "", id)

	if kind == ledger.Effect && s.p.cfg.Ledger != nil {
		if done, keep := s.fromLedger(bw, req, rec, streamed); done {
			return keep
		}
	}

	// The record is in the ledger before a byte leaves.
	rid := s.begin(rec)
	if rid == "" {
		s.writeLocal(bw, req, http.StatusBadGateway, "", "molt egress: the ledger cannot record this request; not sent\n", nil, true)
		return false
	}
	out, err := s.outgoing(req, scheme, body, upBody)
	if err != nil {
		s.finish(rid, ledger.Failed, nil, err.Error())
		s.writeLocal(bw, req, http.StatusBadGateway, rid, "molt egress: "+err.Error()+"\n", nil, true)
		return false
	}
	var wrote atomic.Bool
	out = out.WithContext(httptrace.WithClientTrace(out.Context(), &httptrace.ClientTrace{
		WroteHeaders: func() { wrote.Store(true) },
	}))
	resp, err := s.p.up.roundTrip(out, scheme, sni, s.dst)
	if err != nil {
		errText := "upstream: " + err.Error()
		if bodyHash != nil {
			errText += "; request body sha256 " + hex.EncodeToString(bodyHash.Sum(nil))
		}
		if kind == ledger.Effect && wrote.Load() {
			// The world may have acted on it: the record stays pending
			// (outcome unknown), so an equivalent request is refused
			// rather than sent again, after a rollback too.
			s.p.log.Warn("egress proxy: effect sent without an answer", "sandbox", s.ep.ID, "record", rid, "err", err)
			s.writeLocal(bw, req, http.StatusBadGateway, rid, fmt.Sprintf(
				"molt egress: %s; the request was sent, so ledger record %s stays pending: its outcome is unknown\n", errText, rid), nil, true)
			return false
		}
		s.finish(rid, ledger.Failed, nil, errText)
		s.writeLocal(bw, req, http.StatusBadGateway, rid, "molt egress: "+errText+"\n", nil, streamed)
		return !streamed
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		s.upgrade(c, br, bw, rid, resp)
		return false
	}

	return s.relay(bw, req, resp, rid, bodyHash)
}

// gate applies the domain policy to a request and refuses CONNECT; it
// returns the name the request is judged and recorded by, its kind, and
// false once it answered the sandbox itself.
func (s *session) gate(bw *bufio.Writer, req *http.Request, scheme, host string) (string, ledger.Kind, bool) {
	name := hostName(host)
	if _, err := netip.ParseAddr(name); err == nil || name == "" {
		name = s.resolvedName()
	}
	kind := ledger.Read
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		kind = ledger.Effect
	}
	if ok, why := s.allowName(name); !ok {
		id := ledger.Identity{Proto: scheme, Method: req.Method, URL: scheme + "://" + host + req.URL.RequestURI(), Host: name, Addr: s.dst.String()}
		rid := s.deny(kind, id, why)
		s.writeLocal(bw, req, http.StatusForbidden, rid, "molt egress: "+why+"\n", nil, true)
		return name, kind, false
	}
	if req.Method == http.MethodConnect {
		// A tunnel through an upstream proxy would hide its requests
		// from the ledger; the sandbox connects directly instead.
		why := "CONNECT is not supported; connect to the destination directly"
		id := ledger.Identity{Proto: scheme, Method: req.Method, URL: host, Host: name, Addr: s.dst.String()}
		rid := s.deny(kind, id, why)
		s.writeLocal(bw, req, http.StatusMethodNotAllowed, rid, "molt egress: "+why+"\n", nil, true)
		return name, kind, false
	}
	return name, kind, true
}

// fromLedger answers an effect from the ledger when it must not be sent:
// equivalent to a pending record (409), to an orphan (replayed), or
// divergent under a blocking policy (409). done says it answered; keep,
// whether the connection can carry another request.
func (s *session) fromLedger(bw *bufio.Writer, req *http.Request, rec ledger.Record, streamed bool) (done, keep bool) {
	id := rec.Request
	m := s.p.cfg.Ledger.Match(s.ep.ID, id)
	if streamed {
		// Without its body's hash the request cannot be shown
		// equivalent to anything: it is never refused as pending
		// nor replayed, and it diverges when the line has orphans.
		m.Orphan, m.Pending = nil, nil
	}
	switch {
	case m.Pending != nil:
		rec.State, rec.ReplayOf = ledger.Refused, m.Pending.ID
		rec.Error = "equivalent to pending record " + m.Pending.ID
		rid := s.begin(rec)
		s.writeLocal(bw, req, http.StatusConflict, rid, fmt.Sprintf(
			"molt egress: an equivalent earlier request (ledger record %s) was sent but its outcome is unknown; not sending it again\n", m.Pending.ID), nil, false)
		return true, true
	case m.Orphan != nil:
		return true, s.replay(bw, req, rec, m.Orphan)
	case m.Orphans > 0 && s.ep.Policy.Divergence == DivergeBlock:
		rec.State = ledger.Blocked
		rec.Error = "diverges from history after a rollback"
		rid := s.begin(rec)
		s.writeLocal(bw, req, http.StatusConflict, rid,
			"molt egress: request diverges from history after a rollback; blocked by policy\n", nil, false)
		return true, true
	}
	return false, false
}

// relay writes the world's answer to the sandbox and completes record
// rid with it; it reports whether the connection can carry another
// request.
func (s *session) relay(bw *bufio.Writer, req *http.Request, resp *http.Response, rid string, bodyHash hash.Hash) bool {
	bodyCap := s.p.cfg.BodyCap
	summary := &ledger.Response{Status: resp.StatusCode, Header: resp.Header.Clone()}
	capt := &capture{cap: bodyCap, h: sha256.New()}
	body2 := &errReader{r: io.TeeReader(resp.Body, capt)}
	upstreamBody := resp.Body
	resp.Body = io.NopCloser(body2)
	removeHopHeaders(resp.Header)
	resp.Header.Del(HeaderReplayed) // only molt says a response is replayed
	resp.Header.Set(HeaderLedgerID, rid)
	resp.Close = req.Close
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	if resp.ContentLength < 0 {
		// Upstream framing is per connection: chunk for an HTTP/1.1
		// client, end the connection for an older one.
		if req.ProtoAtLeast(1, 1) {
			resp.TransferEncoding = []string{"chunked"}
		} else {
			resp.TransferEncoding, resp.Close = nil, true
		}
	}
	resp.Request = req
	werr := resp.Write(bw)
	if werr == nil {
		werr = bw.Flush()
	}
	upstreamBody.Close()
	summary.Body, summary.BodySize, summary.Truncated = capt.buf, capt.n, capt.n > int64(len(capt.buf))
	if !summary.Truncated {
		summary.BodyHash = hex.EncodeToString(capt.h.Sum(nil))
	}
	errText := ""
	switch {
	case body2.err != nil:
		errText = "upstream response body: " + body2.err.Error()
	case werr != nil:
		errText = "sandbox: " + werr.Error()
	}
	if bodyHash != nil {
		errText = strings.TrimPrefix(errText+"; request body sha256 "+hex.EncodeToString(bodyHash.Sum(nil)), "; ")
	}
	// The world answered: the effect happened even if the body broke.
	s.finish(rid, ledger.Completed, summary, errText)
	return werr == nil && body2.err == nil && !resp.Close
}

// outgoing is the request sent upstream: to the original destination
// address, with the sandbox's Host.
func (s *session) outgoing(req *http.Request, scheme string, body []byte, stream io.Reader) (*http.Request, error) {
	out := req.Clone(s.p.ctx)
	out.RequestURI = ""
	out.URL.Scheme = scheme
	out.URL.Host = s.dst.String()
	out.URL.User = nil
	out.Host = req.Host
	upgrade := ""
	if headerHasToken(req.Header, "Connection", "upgrade") {
		upgrade = req.Header.Get("Upgrade")
	}
	removeHopHeaders(out.Header)
	if upgrade != "" {
		out.Header.Set("Connection", "Upgrade")
		out.Header.Set("Upgrade", upgrade)
	}
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header["User-Agent"] = []string{""} // keeps net/http from adding its own
	}
	out.Close = false
	out.TransferEncoding = nil
	if stream != nil {
		out.Body = io.NopCloser(stream)
		out.ContentLength = req.ContentLength
	} else if len(body) > 0 {
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.ContentLength = int64(len(body))
		// Lets the transport resend when a pooled connection turns out
		// dead before anything was written.
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	} else {
		out.Body = http.NoBody
		out.ContentLength = 0
		out.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
	}
	return out, nil
}

// replay answers req from an orphaned record and records the replay.
func (s *session) replay(bw *bufio.Writer, req *http.Request, rec ledger.Record, orphan *ledger.Record) bool {
	rec.State, rec.ReplayOf = ledger.Replayed, orphan.ID
	o := orphan.Response
	if o == nil {
		o = &ledger.Response{Status: http.StatusBadGateway}
	}
	rec.Response = &ledger.Response{Status: o.Status, BodySize: o.BodySize, BodyHash: o.BodyHash, Truncated: o.Truncated}
	rid := s.begin(rec)
	h := http.Header(o.Header).Clone()
	if h == nil {
		h = http.Header{}
	}
	removeHopHeaders(h)
	h.Del("Content-Length")
	h.Set(HeaderReplayed, orphan.ID)
	status := o.Status
	if status < 100 || status > 999 {
		status = http.StatusBadGateway
	}
	s.writeResponse(bw, req, status, rid, h, o.Body, false)
	return true
}

// upgrade passes a 101 Switching Protocols on and pipes the connection
// (WebSocket and the like), recorded by bytes.
func (s *session) upgrade(c net.Conn, br *bufio.Reader, bw *bufio.Writer, rid string, resp *http.Response) {
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	summary := &ledger.Response{Status: resp.StatusCode, Header: resp.Header.Clone()}
	if !ok {
		resp.Body.Close()
		s.finish(rid, ledger.Failed, summary, "upstream upgrade: no connection")
		return
	}
	defer rwc.Close()
	resp.Header.Set(HeaderLedgerID, rid)
	fmt.Fprintf(bw, "HTTP/1.1 101 Switching Protocols\r\n")
	resp.Header.Write(bw)
	io.WriteString(bw, "\r\n")
	if err := bw.Flush(); err != nil {
		s.finish(rid, ledger.Completed, summary, "sandbox: "+err.Error())
		return
	}
	done := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(rwc, br) // what the client sent beyond the request head first
		if cw, ok := rwc.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			rwc.Close()
		}
		done <- n
	}()
	in, _ := io.Copy(c, rwc)
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	// The client may hold its side open; the upstream ended, so end it.
	c.SetReadDeadline(time.Now())
	summary.BytesOut, summary.BytesIn = <-done, in
	s.finish(rid, ledger.Completed, summary, "")
}

// writeLocal writes a response made by the proxy itself.
func (s *session) writeLocal(bw *bufio.Writer, req *http.Request, status int, rid, msg string, h http.Header, closeConn bool) {
	if h == nil {
		h = http.Header{}
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	s.writeResponse(bw, req, status, rid, h, []byte(msg), closeConn)
}

func (s *session) writeResponse(bw *bufio.Writer, req *http.Request, status int, rid string, h http.Header, body []byte, closeConn bool) {
	if rid != "" {
		h.Set(HeaderLedgerID, rid)
	}
	resp := &http.Response{
		StatusCode:    status,
		ProtoMajor:    1,
		ProtoMinor:    1,
		Request:       req,
		Header:        h,
		ContentLength: int64(len(body)),
		Body:          io.NopCloser(bytes.NewReader(body)),
		Close:         closeConn || req.Close,
	}
	resp.Write(bw)
	bw.Flush()
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// hostName is the name part of a Host header, lower-cased, without a
// port or IPv6 brackets.
func hostName(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// capture keeps the first cap bytes written to it, counts and hashes
// them all.
type capture struct {
	cap int64
	buf []byte
	n   int64
	h   hash.Hash
}

// Write keeps the first cap bytes and hashes only what it keeps: a
// body beyond the cap is recorded by size, not hash (hashing every byte
// of a large download cost 14% of the proxy's CPU, profiled).
func (c *capture) Write(b []byte) (int, error) {
	if room := c.cap - int64(len(c.buf)); room > 0 {
		kept := b[:min(int64(len(b)), room)]
		c.h.Write(kept)
		c.buf = append(c.buf, kept...)
	}
	c.n += int64(len(b))
	return len(b), nil
}

// errReader remembers the error its reader returned, so a failing
// upstream is told apart from a failing sandbox.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(b []byte) (int, error) {
	n, err := e.r.Read(b)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

// upstreams pools connections to the world. Plain HTTP shares one
// transport (its pool is per destination address); HTTPS has a
// transport per server name, so a pooled connection never serves a name
// other than the one it was verified for.
type upstreams struct {
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	plain *http.Transport

	mu sync.Mutex
	// +checklocks:mu
	roots *x509.CertPool
	// +checklocks:mu
	tls map[string]*http.Transport
}

// maxTLSTransports bounds the per-name transports: the sandbox chooses
// the names.
const maxTLSTransports = 256

func newUpstreams(dial func(ctx context.Context, network, addr string) (net.Conn, error), roots *x509.CertPool) *upstreams {
	u := &upstreams{dial: dial, roots: roots, tls: make(map[string]*http.Transport)}
	u.plain = u.transport(nil)
	return u
}

func (u *upstreams) transport(tc *tls.Config) *http.Transport {
	return &http.Transport{
		Proxy:                  nil,
		DialContext:            u.dial,
		TLSClientConfig:        tc,
		TLSHandshakeTimeout:    15 * time.Second,
		TLSNextProto:           map[string]func(string, *tls.Conn) http.RoundTripper{}, // HTTP/1.1 only
		DisableCompression:     true,
		MaxIdleConns:           256,
		MaxIdleConnsPerHost:    32,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: maxHeaderBytes,
		// Bodies stream through the proxy: reads of the default 4 KiB
		// made system calls half its CPU time (profiled).
		ReadBufferSize:  256 << 10,
		WriteBufferSize: 64 << 10,
	}
}

func (u *upstreams) roundTrip(req *http.Request, scheme, sni string, dst netip.AddrPort) (*http.Response, error) {
	if scheme == "http" {
		return u.plain.RoundTrip(req)
	}
	name := sni
	if name == "" {
		name = dst.Addr().String() // verified against the certificate's IP addresses
	}
	u.mu.Lock()
	t, ok := u.tls[name]
	if !ok {
		if len(u.tls) >= maxTLSTransports {
			for k, old := range u.tls {
				old.CloseIdleConnections()
				delete(u.tls, k)
				break
			}
		}
		t = u.transport(&tls.Config{
			ServerName:         name,
			RootCAs:            u.roots,
			NextProtos:         []string{"http/1.1"},
			MinVersion:         tls.VersionTLS12,
			ClientSessionCache: tls.NewLRUClientSessionCache(16),
		})
		u.tls[name] = t
	}
	u.mu.Unlock()
	return t.RoundTrip(req)
}

func (u *upstreams) close() {
	u.plain.CloseIdleConnections()
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, t := range u.tls {
		t.CloseIdleConnections()
	}
}
