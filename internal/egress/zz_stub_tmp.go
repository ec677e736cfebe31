package egress

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net"
	"net/netip"

	"github.com/molt-sh/molt/internal/egress/ledger"
)

type Ledger interface {
	Begin(sb string, r ledger.Record) (ledger.Record, error)
}
type ProxyConfig struct {
	Lookup        func(src netip.Addr) (*Endpoint, bool)
	Ledger        Ledger
	Dial          func(ctx context.Context, network, addr string) (net.Conn, error)
	UpstreamRoots *x509.CertPool
	Names         *Names
	BodyCap       int64
	Denied        []netip.Prefix
	Log           *slog.Logger
}
type Proxy struct{}

func NewProxy(ProxyConfig) *Proxy           { return &Proxy{} }
func (p *Proxy) Serve(l net.Listener) error { return nil }
func (p *Proxy) Close() error               { return nil }

type DNSConfig struct {
	Lookup   func(src netip.Addr) (*Endpoint, bool)
	Upstream []string
	Dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	Names    *Names
	Record   func(ep *Endpoint, r ledger.Record)
	Log      *slog.Logger
}
type DNS struct{}

func NewDNS(DNSConfig) *DNS                     { return &DNS{} }
func (d *DNS) ServeUDP(pc net.PacketConn) error { return nil }
func (d *DNS) ServeTCP(l net.Listener) error    { return nil }
func (d *DNS) Close() error                     { return nil }

func NewCA(name string) (*CA, error)              { return &CA{}, nil }
func ParseCA(certPEM, keyPEM []byte) (*CA, error) { return &CA{}, nil }
func (c *CA) CertPEM() []byte                     { return nil }
func (c *CA) KeyPEM() ([]byte, error)             { return nil, nil }
