package netlab

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/ns"
)

// DialContext connects from inside the lab, as a process in its
// namespace would. Names are resolved from the lab's own table, never
// through the host's resolver.
func (l *Lab) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if _, err := netip.ParseAddr(host); err != nil {
		a, ok := l.Lookup(host)
		if !ok {
			return nil, fmt.Errorf("dial %s: no host %s in the lab", addr, host)
		}
		addr = net.JoinHostPort(a.String(), port)
	}
	var c net.Conn
	err = ns.Do(l.netns, unix.CLONE_NEWNET, func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// TLSConfig trusts the lab's CA.
func (l *Lab) TLSConfig() *tls.Config { return &tls.Config{RootCAs: l.certs.pool} }

// Client is an HTTP/1.1 client (as pip, requests and urllib are) whose
// connections start inside the lab and which trusts the lab's CA.
func (l *Lab) Client() *http.Client {
	return &http.Client{
		Timeout: time.Minute,
		Transport: &http.Transport{
			DialContext:     l.DialContext,
			TLSClientConfig: l.TLSConfig(),
		},
	}
}

// Listen makes a listener inside the lab (for a test's own server, at
// one of the lab's addresses or an address of Options.Hosts). Close
// closes it too.
func (l *Lab) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := ns.Do(l.netns, unix.CLONE_NEWNET, func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		return nil, err
	}
	l.track(ln)
	return ln, nil
}

// ListenPacket is Listen for datagrams.
func (l *Lab) ListenPacket(network, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := ns.Do(l.netns, unix.CLONE_NEWNET, func() error {
		var err error
		pc, err = net.ListenPacket(network, addr)
		return err
	})
	if err != nil {
		return nil, err
	}
	l.track(pc)
	return pc, nil
}

// track closes c at Close (at once when the lab is closed already).
func (l *Lab) track(c io.Closer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.done:
		c.Close()
	default:
		l.extra = append(l.extra, c)
	}
}

// ServerTLS is the configuration of the lab's HTTPS servers (its
// certificate covers every lab name, Options.Hosts included), for a
// test's own server behind Listen.
func (l *Lab) ServerTLS() *tls.Config { return l.certs.serverTLS() }
