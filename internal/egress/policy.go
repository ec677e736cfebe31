// Package egress gives sandboxes a network path to the world through
// molt: a router network namespace of molt's own, a veth per sandbox, a
// transparent proxy and DNS server that apply the sandbox's policy, and
// a ledger (package ledger) of every effect that leaves.
package egress

import (
	"fmt"
	"net/netip"
	"strings"
)

// Divergence is what the proxy does with an effect that matches no
// orphaned effect while the sandbox's line still has orphans (it is
// re-running history after a rollback or fork).
type Divergence string

const (
	DivergeForward Divergence = "forward" // send it as a new effect (default)
	DivergeBlock   Divergence = "block"   // refuse it and record the refusal
)

// Policy is a sandbox's egress policy. Domains match a name and its
// subdomains ("example.com" matches "api.example.com"); a leading "*."
// is accepted and means the same. A destination is allowed when no deny
// entry matches it and either Allow is empty or an allow entry matches.
// Denied by default whatever Allow says, unless an Allow CIDR names them
// explicitly: private ranges, loopback, link-local (cloud metadata), the
// host, molt's own range (other sandboxes).
type Policy struct {
	AllowDomains []string       `json:"allow_domains,omitempty"`
	DenyDomains  []string       `json:"deny_domains,omitempty"`
	AllowCIDRs   []netip.Prefix `json:"allow_cidrs,omitempty"`
	DenyCIDRs    []netip.Prefix `json:"deny_cidrs,omitempty"`
	// Ports beyond 80 and 443 whose TCP the proxy parses as HTTP.
	HTTPPorts []uint16 `json:"http_ports,omitempty"`
	// Inspect terminates TLS with the sandbox's CA and records HTTPS
	// requests like HTTP ones; without it HTTPS is recorded per
	// connection (SNI, bytes, timing).
	Inspect    bool       `json:"inspect,omitempty"`
	Divergence Divergence `json:"on_divergence,omitempty"`
	// Equivalence rules for replay (see ledger.Canon).
	IgnoreHeaders    []string `json:"ignore_headers,omitempty"`
	IgnoreJSONFields []string `json:"ignore_json_fields,omitempty"`
}

// DefaultDenied are the ranges no sandbox reaches unless its policy's
// AllowCIDRs names a range inside one of them.
var DefaultDenied = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
}

// Validate checks and normalizes p.
func (p *Policy) Validate() error {
	for _, list := range [][]string{p.AllowDomains, p.DenyDomains} {
		for i, d := range list {
			n := normDomain(d)
			if n == "" || len(n) > 253 || strings.Trim(n, "abcdefghijklmnopqrstuvwxyz0123456789-.") != "" || strings.Contains(n, "..") {
				return fmt.Errorf("domain %q: want a DNS name such as example.com or *.example.com", d)
			}
			list[i] = n
		}
	}
	for _, list := range [][]netip.Prefix{p.AllowCIDRs, p.DenyCIDRs} {
		for i, c := range list {
			if !c.IsValid() {
				return fmt.Errorf("cidr %v: invalid", c)
			}
			list[i] = c.Masked()
		}
	}
	for _, port := range p.HTTPPorts {
		if port == 0 {
			return fmt.Errorf("http port 0: want 1-65535")
		}
	}
	switch p.Divergence {
	case "":
		p.Divergence = DivergeForward
	case DivergeForward, DivergeBlock:
	default:
		return fmt.Errorf("on_divergence %q: want forward or block", p.Divergence)
	}
	return nil
}

func normDomain(d string) string {
	d = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(d), "."))
	return strings.TrimPrefix(d, "*.")
}

func domainIn(name string, list []string) bool {
	name = normDomain(name)
	for _, d := range list {
		if name == d || strings.HasSuffix(name, "."+d) {
			return true
		}
	}
	return false
}

// AllowDomain reports whether the policy lets the sandbox resolve and
// reach name, and why not.
func (p *Policy) AllowDomain(name string) (bool, string) {
	if domainIn(name, p.DenyDomains) {
		return false, "domain " + normDomain(name) + " is denied by the sandbox's egress policy"
	}
	if len(p.AllowDomains) > 0 && !domainIn(name, p.AllowDomains) {
		return false, "domain " + normDomain(name) + " is not in the sandbox's egress allow list"
	}
	return true, ""
}

// AllowAddr reports whether the policy lets the sandbox reach addr, and
// why not. extra are ranges denied by default on this host beyond
// DefaultDenied (its own addresses, molt's range).
func (p *Policy) AllowAddr(addr netip.Addr, extra ...netip.Prefix) (bool, string) {
	addr = addr.Unmap()
	for _, c := range p.DenyCIDRs {
		if c.Contains(addr) {
			return false, fmt.Sprintf("address %v is in denied range %v", addr, c)
		}
	}
	explicit := false
	for _, c := range p.AllowCIDRs {
		if c.Contains(addr) {
			explicit = true
			break
		}
	}
	if !explicit {
		for _, c := range append(DefaultDenied[:len(DefaultDenied):len(DefaultDenied)], extra...) {
			if c.Contains(addr) {
				return false, fmt.Sprintf("address %v is in %v, denied by default (private, local or molt's own)", addr, c)
			}
		}
	}
	// An allow list of CIDRs only (no domains) restricts addresses; with
	// domains, names decide and addresses only deny.
	if len(p.AllowCIDRs) > 0 && len(p.AllowDomains) == 0 && !explicit {
		return false, fmt.Sprintf("address %v is not in the sandbox's egress allow list", addr)
	}
	return true, ""
}

// IsHTTPPort reports whether TCP to port is parsed as plain HTTP.
func (p *Policy) IsHTTPPort(port uint16) bool {
	if port == 80 {
		return true
	}
	for _, q := range p.HTTPPorts {
		if q == port {
			return true
		}
	}
	return false
}
