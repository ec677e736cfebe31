package egress

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/ns"
)

// startServers starts the proxy and the DNS server on the gateway
// address in the router namespace.
//
// +checklocks:h.mu
func (h *Host) startServers() error {
	gw := h.Gateway().String()
	var tl, dl net.Listener
	var pc net.PacketConn
	err := ns.Do(h.router, unix.CLONE_NEWNET, func() error {
		var err error
		if tl, err = net.Listen("tcp4", net.JoinHostPort(gw, fmt.Sprint(proxyPort))); err != nil {
			return err
		}
		if dl, err = net.Listen("tcp4", net.JoinHostPort(gw, "53")); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp4", net.JoinHostPort(gw, "53"))
		return err
	})
	if err != nil {
		for _, c := range []interface{ Close() error }{tl, dl} {
			if c != nil {
				c.Close()
			}
		}
		return fmt.Errorf("egress: listen in the router namespace: %w", err)
	}
	upstream := h.cfg.DNS
	if len(upstream) == 0 {
		upstream = systemResolvers()
	}
	for i, u := range upstream {
		if _, _, err := net.SplitHostPort(u); err != nil {
			upstream[i] = net.JoinHostPort(u, "53")
		}
	}
	p := NewProxy(ProxyConfig{Lookup: h.lookup, Ledger: h.cfg.Ledger, Dial: h.dial, UpstreamRoots: h.cfg.UpstreamRoots,
		Names: &h.names, Denied: h.denied, Log: h.log})
	d := NewDNS(DNSConfig{Lookup: h.lookup, Upstream: upstream, Dial: h.dial, Names: &h.names, Log: h.log,
		Record: func(ep *Endpoint, r ledger.Record) {
			if h.cfg.Ledger == nil {
				return
			}
			if _, err := h.cfg.Ledger.Begin(ep.ID, r); err != nil {
				h.log.Warn("egress: cannot record a DNS lookup", "sandbox", ep.ID, "err", err)
			}
		}})
	go func() { _ = p.Serve(tl) }()
	go func() { _ = d.ServeTCP(dl) }()
	go func() { _ = d.ServeUDP(pc) }()
	h.proxy, h.dns = p, d
	h.closers = append(h.closers, func() {
		tl.Close()
		dl.Close()
		pc.Close()
		_ = p.Close()
		_ = d.Close()
	})
	return nil
}

// systemResolvers are the nameservers of /etc/resolv.conf.
func systemResolvers() []string {
	f, err := os.Open("/etc/resolv.conf")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[0] == "nameserver" {
			if a, err := netip.ParseAddr(fs[1]); err == nil && a.Is4() {
				out = append(out, net.JoinHostPort(a.String(), "53"))
			}
		}
	}
	return out
}
