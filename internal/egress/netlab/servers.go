package netlab

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

var defaultHosts = map[string]netip.Addr{
	WebName:   netip.MustParseAddr(WebIP),
	PayName:   netip.MustParseAddr(PayIP),
	OtherName: netip.MustParseAddr(OtherIP),
	FilesName: netip.MustParseAddr(FilesIP),
}

// maxBody caps what the lab reads of a request body.
const maxBody = 1 << 20

// listen creates every listener on the calling thread (in the lab's
// namespace) and starts serving them.
func (l *Lab) listen() error {
	web := l.httpServer(l.webMux())
	pay := l.httpServer(l.payMux())
	other := l.httpServer(otherMux())
	tlsConf := l.certs.serverTLS()
	for _, s := range []struct {
		srv *http.Server
		ip  string
	}{{web, WebIP}, {web, FilesIP}, {pay, PayIP}, {other, OtherIP}} {
		for _, port := range []string{"80", "443"} {
			ln, err := net.Listen("tcp4", net.JoinHostPort(s.ip, port))
			if err != nil {
				return err
			}
			if port == "443" {
				ln = tls.NewListener(ln, tlsConf)
			}
			l.serve(func() { s.srv.Serve(ln) }, ln.Close)
		}
	}
	for _, srv := range []*http.Server{web, pay, other} {
		l.closers = append(l.closers, srv.Close)
	}
	if err := l.echo(); err != nil {
		return err
	}
	return l.dns()
}

// serve runs fn in a goroutine Close waits for; stop makes fn return.
func (l *Lab) serve(fn func(), stop func() error) {
	l.closers = append(l.closers, func() error {
		if err := stop(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	})
	l.wg.Go(fn)
}

func (l *Lab) httpServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
}

const helloBody = "hello from the lab\n"

func (l *Lab) webMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, helloBody) })
	mux.HandleFunc("/echo", echoHTTP)
	mux.HandleFunc("GET /bytes/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.PathValue("n"), 10, 64)
		if err != nil || n < 0 || n > MaxBytes {
			http.Error(w, fmt.Sprintf("want 0-%d bytes", int64(MaxBytes)), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		writePattern(w, n)
	})
	mux.HandleFunc("GET /pkg/"+DemoFile, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/gzip")
		w.Write(DemoPackage())
	})
	mux.HandleFunc("GET /pkg/"+DemoFile+".sha256", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, DemoSHA256()+"  "+DemoFile+"\n")
	})
	mux.HandleFunc("GET /pkg/"+DemoWheel, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/zip")
		w.Write(wheel())
	})
	mux.HandleFunc("GET /simple/{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<!DOCTYPE html>\n<html><body><a href=\"/simple/demo/\">demo</a></body></html>\n")
	})
	mux.HandleFunc("GET /simple/demo/{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, simpleIndex())
	})
	return mux
}

// Echo is what /echo answers: the request as the lab saw it.
type Echo struct {
	Method string            `json:"method"`
	Path   string            `json:"path"`
	Query  string            `json:"query,omitempty"`
	Body   string            `json:"body"`
	Header map[string]string `json:"header,omitempty"` // first value of each
}

func echoHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	e := Echo{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: string(body), Header: map[string]string{}}
	for k, v := range r.Header {
		e.Header[k] = v[0]
	}
	writeJSON(w, e)
}

func otherMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello from other\n") })
	return mux
}

// echo starts the raw TCP and UDP echo services on WebIP.
func (l *Lab) echo() error {
	ln, err := net.Listen("tcp4", net.JoinHostPort(WebIP, strconv.Itoa(TCPEchoPort)))
	if err != nil {
		return err
	}
	conns := newConnSet()
	l.serve(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !conns.add(c) {
				return
			}
			l.wg.Go(func() {
				defer conns.remove(c)
				io.Copy(c, c)
			})
		}
	}, func() error { err := ln.Close(); conns.closeAll(); return err })

	pc, err := net.ListenPacket("udp4", net.JoinHostPort(WebIP, strconv.Itoa(UDPEchoPort)))
	if err != nil {
		return err
	}
	l.serve(func() {
		buf := make([]byte, 64<<10)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			pc.WriteTo(buf[:n], from)
		}
	}, pc.Close)
	return nil
}

// dns starts the lab's DNS server on DNSIP:53, UDP and TCP.
func (l *Lab) dns() error {
	addr := net.JoinHostPort(DNSIP, "53")
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		pc.Close()
		return err
	}
	h := dns.HandlerFunc(l.serveDNS)
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		exited := make(chan struct{})
		l.serve(func() { defer close(exited); srv.ActivateAndServe() }, func() error {
			select {
			case <-started:
				return srv.Shutdown()
			case <-exited:
				return nil
			}
		})
		select {
		case <-started:
		case <-exited:
			return fmt.Errorf("lab dns server on %s stopped at start", addr)
		}
	}
	return nil
}

// dnsTTL is the TTL of the lab's answers.
const dnsTTL = 60

func (l *Lab) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	m.RecursionAvailable = true
	q := req.Question[0] // the server's accept function wants exactly one
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	owner := q.Name
	if name == AliasName {
		m.Answer = append(m.Answer, &dns.CNAME{
			Hdr:    dns.RR_Header{Name: q.Name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: dnsTTL},
			Target: WebName + ".",
		})
		name, owner = WebName, WebName+"."
	}
	a, ok := l.hosts[name]
	switch {
	case q.Qclass != dns.ClassINET:
		m.Rcode = dns.RcodeRefused
	case !ok:
		m.Rcode = dns.RcodeNameError
		m.Ns = []dns.RR{&dns.SOA{
			Hdr: dns.RR_Header{Name: Zone + ".", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: dnsTTL},
			Ns:  "ns." + Zone + ".", Mbox: "hostmaster." + Zone + ".",
			Serial: 1, Refresh: 3600, Retry: 600, Expire: 86400, Minttl: dnsTTL,
		}}
	case q.Qtype == dns.TypeA:
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: owner, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: dnsTTL},
			A:   a.AsSlice(),
		})
	}
	w.WriteMsg(m)
}
