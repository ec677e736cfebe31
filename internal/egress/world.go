package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"time"
)

// WorldClient returns an HTTP client that reaches the world the
// sandboxes' proxy reaches: it dials from the router namespace (out
// through the uplink, masqueraded as the proxy's own connections are),
// resolves names with the upstream resolvers of molt's DNS, and trusts
// the system roots plus Config.UpstreamRoots. It is for requests the
// daemon sends on a sandbox's behalf (compensators); they are not
// recorded as the sandbox's. It works once the host has started (a
// sandbox with egress was added).
func (h *Host) WorldClient(timeout time.Duration) *http.Client {
	upstream := make([]string, 0, len(h.cfg.DNS))
	for _, u := range h.cfg.DNS {
		if _, _, err := net.SplitHostPort(u); err != nil {
			u = net.JoinHostPort(u, "53")
		}
		upstream = append(upstream, u)
	}
	if len(upstream) == 0 {
		upstream = systemResolvers()
	}
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var errs []error
		for _, u := range upstream {
			c, err := h.dial(ctx, network, u)
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
		}
		if len(errs) == 0 {
			return nil, errors.New("no upstream resolver")
		}
		return nil, errors.Join(errs...)
	}}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		ips, err := res.LookupIP(ctx, "ip4", host)
		if err != nil {
			return nil, err
		}
		var errs []error
		for _, ip := range ips {
			c, err := h.dial(ctx, network, net.JoinHostPort(ip.String(), port))
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
		}
		return nil, errors.Join(errs...)
	}
	t := &http.Transport{
		DialContext:         dial,
		TLSClientConfig:     &tls.Config{RootCAs: h.cfg.UpstreamRoots},
		TLSHandshakeTimeout: 10 * time.Second,
		DisableKeepAlives:   true,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: t, Timeout: timeout}
}
