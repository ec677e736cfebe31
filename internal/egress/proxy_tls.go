package egress

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/molt-sh/molt/internal/egress/ledger"
)

const (
	recordTypeHandshake  = 0x16
	handshakeClientHello = 1
	maxTLSRecord         = 16384 + 2048 // TLSCiphertext limit
	maxClientHello       = 64 << 10     // far beyond real ones (a few KiB with post-quantum shares)
	extServerName        = 0
	extALPN              = 16
	maxALPN              = 16 // protocols kept of an offer
	serverNameTypeHost   = 0
	maxServerNameLength  = 253
)

var errNotTLS = errors.New("not a TLS ClientHello")

// clientHello is what the proxy reads of a ClientHello.
type clientHello struct {
	SNI  string   // "" when the client sent none
	ALPN []string // protocols offered
}

// offersHTTP reports whether the client offered an HTTP protocol.
func (h clientHello) offersHTTP() bool {
	for _, p := range h.ALPN {
		if p == "http/1.1" || p == "h2" || p == "http/1.0" {
			return true
		}
	}
	return false
}

// readClientHello reads the TLS records that carry the first handshake
// message from r, and no more. It returns the raw bytes read (to be
// replayed upstream or to a TLS server) and what the hello says.
func readClientHello(r io.Reader) (raw []byte, hello clientHello, err error) {
	var msg []byte
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return raw, clientHello{}, err
		}
		raw = append(raw, hdr[:]...)
		if hdr[0] != recordTypeHandshake || hdr[1] != 3 {
			return raw, clientHello{}, errNotTLS
		}
		n := int(hdr[3])<<8 | int(hdr[4])
		if n == 0 || n > maxTLSRecord {
			return raw, clientHello{}, fmt.Errorf("%w: record length %d", errNotTLS, n)
		}
		start := len(raw)
		raw = append(raw, make([]byte, n)...)
		if k, err := io.ReadFull(r, raw[start:]); err != nil {
			return raw[:start+k], clientHello{}, err
		}
		msg = append(msg, raw[start:]...)
		if len(msg) < 4 {
			continue
		}
		if msg[0] != handshakeClientHello {
			return raw, clientHello{}, fmt.Errorf("%w: handshake type %d", errNotTLS, msg[0])
		}
		size := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
		if size > maxClientHello {
			return raw, clientHello{}, fmt.Errorf("%w: ClientHello of %d bytes", errNotTLS, size)
		}
		if len(msg) >= 4+size {
			hello, err := parseClientHello(msg[4 : 4+size])
			return raw, hello, err
		}
	}
}

// parseClientHello reads a ClientHello body's server_name and ALPN
// extensions.
func parseClientHello(b []byte) (clientHello, error) {
	var h clientHello
	p := parser(b)
	if !p.skip(2+32) || !p.skipVec(1) || !p.skipVec(2) || !p.skipVec(1) {
		return h, fmt.Errorf("%w: truncated ClientHello", errNotTLS)
	}
	if len(p) == 0 {
		return h, nil // no extensions
	}
	exts, ok := p.vec(2)
	if !ok {
		return h, fmt.Errorf("%w: truncated extensions", errNotTLS)
	}
	for len(exts) > 0 {
		typ, ok1 := exts.u16()
		data, ok2 := exts.vec(2)
		if !ok1 || !ok2 {
			return h, fmt.Errorf("%w: truncated extension", errNotTLS)
		}
		switch typ {
		case extServerName:
			list, ok := data.vec(2)
			if !ok {
				return h, fmt.Errorf("%w: bad server_name", errNotTLS)
			}
			for len(list) > 0 && h.SNI == "" {
				nt, ok1 := list.u8()
				name, ok2 := list.vec(2)
				if !ok1 || !ok2 {
					return h, fmt.Errorf("%w: bad server_name", errNotTLS)
				}
				if nt != serverNameTypeHost {
					continue
				}
				sni, err := checkServerName(string(name))
				if err != nil {
					return h, err
				}
				h.SNI = sni
			}
		case extALPN:
			list, ok := data.vec(2)
			if !ok {
				return h, fmt.Errorf("%w: bad ALPN", errNotTLS)
			}
			for len(list) > 0 && len(h.ALPN) < maxALPN {
				proto, ok := list.vec(1)
				if !ok {
					return h, fmt.Errorf("%w: bad ALPN", errNotTLS)
				}
				h.ALPN = append(h.ALPN, string(proto))
			}
		}
	}
	return h, nil
}

// checkServerName accepts what a DNS host name can be, lower-cased: the
// name is judged by the policy and written to the ledger.
func checkServerName(s string) (string, error) {
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	if s == "" || len(s) > maxServerNameLength {
		return "", fmt.Errorf("%w: server name of %d bytes", errNotTLS, len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return "", fmt.Errorf("%w: server name %q", errNotTLS, s)
		}
	}
	return s, nil
}

// parser reads big-endian TLS vectors, every read bounds-checked.
type parser []byte

func (p *parser) skip(n int) bool {
	if n < 0 || len(*p) < n {
		return false
	}
	*p = (*p)[n:]
	return true
}

func (p *parser) u8() (uint8, bool) {
	if len(*p) < 1 {
		return 0, false
	}
	v := (*p)[0]
	*p = (*p)[1:]
	return v, true
}

func (p *parser) u16() (uint16, bool) {
	if len(*p) < 2 {
		return 0, false
	}
	v := uint16((*p)[0])<<8 | uint16((*p)[1])
	*p = (*p)[2:]
	return v, true
}

// vec reads a vector with an lenBytes-byte length prefix.
func (p *parser) vec(lenBytes int) (parser, bool) {
	if len(*p) < lenBytes {
		return nil, false
	}
	n := 0
	for i := 0; i < lenBytes; i++ {
		n = n<<8 | int((*p)[i])
	}
	*p = (*p)[lenBytes:]
	if len(*p) < n {
		return nil, false
	}
	v := (*p)[:n]
	*p = (*p)[n:]
	return v, true
}

func (p *parser) skipVec(lenBytes int) bool {
	_, ok := p.vec(lenBytes)
	return ok
}

// serveTLS handles a TLS connection whose first bytes (prefix) may
// already be read: passthrough recorded per connection, or, with
// inspection, terminated with the sandbox's CA and served as HTTPS.
func (s *session) serveTLS(prefix []byte) {
	s.c.SetReadDeadline(time.Now().Add(helloTimeout))
	raw, hello, err := readClientHello(io.MultiReader(bytes.NewReader(prefix), s.c))
	sni := hello.SNI
	s.c.SetReadDeadline(time.Time{})
	if err != nil {
		s.p.log.Debug("egress proxy: no ClientHello", "sandbox", s.ep.ID, "dst", s.dst, "err", err)
		reset(s.c)
		return
	}
	name := sni
	if name == "" {
		name = s.resolvedName()
	}
	id := ledger.Identity{Proto: "tls", Host: name, Addr: s.dst.String()}
	if ok, why := s.allowName(name); !ok {
		s.deny(ledger.Opaque, id, why)
		reset(s.c)
		return
	}
	// Inspection serves HTTP: on ports other than 443 only a client
	// offering HTTP is terminated, other TLS (IMAPS, ...) passes through.
	if !s.ep.Policy.Inspect || s.dst.Port() != 443 && !hello.offersHTTP() {
		s.tunnel(id, s.c, raw)
		return
	}
	if s.ep.CA == nil {
		s.deny(ledger.Opaque, id, "inspection is on but the sandbox has no CA")
		reset(s.c)
		return
	}
	certName := sni
	if certName == "" {
		certName = s.dst.Addr().String()
	}
	tc := tls.Server(&prefixConn{Conn: s.c, prefix: raw}, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.ep.CA.Leaf(certName)
		},
	})
	tc.SetDeadline(time.Now().Add(helloTimeout))
	if err := tc.HandshakeContext(s.p.ctx); err != nil {
		s.p.log.Debug("egress proxy: TLS handshake with sandbox", "sandbox", s.ep.ID, "err", err)
		return
	}
	tc.SetDeadline(time.Time{})
	s.serveHTTP(tc, "https", sni)
}
