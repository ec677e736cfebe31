package egress

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The router namespace's ruleset is molt's alone (the namespace is), and
// is rewritten whole, in one netlink batch, whenever a sandbox joins,
// leaves or changes its policy: the kernel swaps it atomically, so there
// are no stale rules to track. Rules name sandboxes by address, not by
// interface, so a rollback (a new veth for the same sandbox) changes no
// rule; strict reverse-path filtering in the namespace guarantees that a
// packet with a sandbox's source address came in on that sandbox's veth.
//
// Why github.com/google/nftables and not the nft command or iptables:
// no binary to install on the host, no fork on the create path, and the
// batch is atomic. The cost is building expressions by hand, kept here.

const tableName = "molt"

// sbRules is what the ruleset needs of one sandbox.
type sbRules struct {
	addr   netip.Addr
	policy Policy
	bypass bool // Endpoint.Bypass: benchmarks' NAT-only baseline
}

// ruleset describes the router namespace's table.
type ruleset struct {
	rng       netip.Prefix // sandbox addresses
	gateway   netip.Addr   // the proxy's and DNS server's address
	proxyPort uint16
	uplink    string // the router's uplink interface
	denied    []netip.Prefix
	sandboxes []sbRules
}

// apply replaces the router namespace's table by rs.
func (rs ruleset) apply(netns *os.File) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(netns.Fd())))
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	defer c.CloseLasting()
	old := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: tableName}
	if t, err := c.ListTableOfFamily(tableName, nftables.TableFamilyIPv4); err == nil && t != nil {
		c.DelTable(old)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: tableName})
	pre := c.AddChain(&nftables.Chain{Name: "pre", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	proxy := c.AddChain(&nftables.Chain{Name: "proxy", Table: t})
	fwd := c.AddChain(&nftables.Chain{Name: "fwd", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	in := c.AddChain(&nftables.Chain{Name: "in", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
	post := c.AddChain(&nftables.Chain{Name: "post", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	add := func(ch *nftables.Chain, e ...expr.Any) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e}) }

	fromSandboxes := prefixMatch(payloadSaddr, rs.rng)
	// DNS, whatever resolver a sandbox names, goes to molt's.
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		add(pre, cat(fromSandboxes, l4(proto), dport(53), dnatTo(rs.gateway, 53))...)
	}
	// Per sandbox: its denied destinations skip the proxy and are
	// refused in the forward chain (the sandbox sees connection
	// refused); its explicitly allowed ranges go to the proxy.
	for _, s := range rs.sandboxes {
		from := addrMatch(payloadSaddr, s.addr)
		if s.bypass {
			// No DNAT: the flow keeps its destination and is routed.
			add(pre, cat(from, verdict(expr.VerdictAccept))...)
			continue
		}
		for _, p := range s.policy.DenyCIDRs {
			if p.Addr().Is4() {
				add(pre, cat(from, prefixMatch(payloadDaddr, p), markDeny())...)
			}
		}
		for _, p := range s.policy.AllowCIDRs {
			if p.Addr().Is4() {
				add(pre, cat(from, prefixMatch(payloadDaddr, p), goTo("proxy"))...)
			}
		}
		for _, p := range append(DefaultDenied[:len(DefaultDenied):len(DefaultDenied)], rs.denied...) {
			if p.Addr().Is4() {
				add(pre, cat(from, prefixMatch(payloadDaddr, p), markDeny())...)
			}
		}
		if len(s.policy.AllowCIDRs) > 0 && len(s.policy.AllowDomains) == 0 {
			add(pre, cat(from, markDeny())...)
		}
	}
	add(pre, cat(fromSandboxes, goTo("proxy"))...)
	// Every TCP connection from a sandbox goes to the proxy; the rest
	// falls through to the forward chain.
	add(proxy, cat(l4(unix.IPPROTO_TCP), dnatTo(rs.gateway, rs.proxyPort))...)

	// Forwarding: replies; a sandbox's flow its policy denies is logged
	// (the ledger records it) and refused, so the sandbox sees connection
	// refused; its UDP (not DNS, which went to molt's) is logged and
	// forwarded; nothing else of a sandbox's is forwarded (its TCP went
	// to the proxy).
	add(fwd, cat(ctEstablished(), verdict(expr.VerdictAccept))...)
	for _, s := range rs.sandboxes {
		if s.bypass {
			add(fwd, cat(addrMatch(payloadSaddr, s.addr), oifname(rs.uplink), verdict(expr.VerdictAccept))...)
		}
	}
	denied := cat(fromSandboxes, &expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, markDenied)})
	add(fwd, cat(denied, nflog(prefixDeny))...)
	add(fwd, cat(denied, l4(unix.IPPROTO_TCP), &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})...)
	add(fwd, cat(denied, &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3})...)
	add(fwd, cat(fromSandboxes, l4(unix.IPPROTO_UDP), oifname(rs.uplink), nflog(prefixUDP), verdict(expr.VerdictAccept))...)
	add(fwd, cat(fromSandboxes, l4(unix.IPPROTO_TCP), &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})...)
	add(fwd, cat(fromSandboxes, &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3})...)

	// The namespace itself: sandboxes reach the proxy and DNS only.
	add(in, cat(ctEstablished(), verdict(expr.VerdictAccept))...)
	add(in, cat(fromSandboxes, addrMatch(payloadDaddr, rs.gateway), l4(unix.IPPROTO_TCP), dport(rs.proxyPort), verdict(expr.VerdictAccept))...)
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		add(in, cat(fromSandboxes, addrMatch(payloadDaddr, rs.gateway), l4(proto), dport(53), verdict(expr.VerdictAccept))...)
	}
	add(in, cat(fromSandboxes, verdict(expr.VerdictDrop))...)

	// What leaves through the uplink leaves with the router's address.
	add(post, cat(oifname(rs.uplink), &expr.Masq{})...)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: write the router's ruleset: %w", err)
	}
	return nil
}

// hostRules sets up the uplink namespace for host mode: what the router
// sends out through iface is masqueraded and forwarded, in a table of
// molt's own (name) so the host's firewall is left alone.
func hostRules(netns *os.File, name, iface string, router netip.Addr) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(netns.Fd())))
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	defer c.CloseLasting()
	if t, err := c.ListTableOfFamily(name, nftables.TableFamilyIPv4); err == nil && t != nil {
		c.DelTable(t)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: name})
	post := c.AddChain(&nftables.Chain{Name: "post", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	fwd := c.AddChain(&nftables.Chain{Name: "fwd", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	add := func(ch *nftables.Chain, e ...expr.Any) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e}) }
	add(post, cat(addrMatch(payloadSaddr, router), notOifname(iface), &expr.Masq{})...)
	add(fwd, cat(iifname(iface), verdict(expr.VerdictAccept))...)
	add(fwd, cat(oifname(iface), ctEstablished(), verdict(expr.VerdictAccept))...)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: write table %s: %w", name, err)
	}
	return nil
}

// deleteTable removes table name from netns, if there.
func deleteTable(netns *os.File, name string) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(netns.Fd())))
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	defer c.CloseLasting()
	t, err := c.ListTableOfFamily(name, nftables.TableFamilyIPv4)
	if err != nil || t == nil {
		return nil
	}
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: delete table %s: %w", name, err)
	}
	return nil
}

func cat(parts ...any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		switch v := p.(type) {
		case []expr.Any:
			out = append(out, v...)
		case expr.Any:
			out = append(out, v)
		}
	}
	return out
}

const (
	payloadSaddr = 12
	payloadDaddr = 16
)

func addrMatch(off uint32, a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b[:]},
	}
}

func prefixMatch(off uint32, p netip.Prefix) []expr.Any {
	p = p.Masked()
	if p.Bits() == 32 {
		return addrMatch(off, p.Addr())
	}
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = []byte{0, 0, 0, 0}
	}
	net := p.Addr().As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net[:]},
	}
}

func l4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func dport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, p)},
	}
}

func dnatTo(a netip.Addr, port uint16) []expr.Any {
	b := a.As4()
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: b[:]},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

func ctEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func iifname(n string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(n)}}
}

func oifname(n string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(n)}}
}

func notOifname(n string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(n)}}
}

// markDeny marks a sandbox's flow as denied and skips the proxy: the
// forward chain logs and refuses it.
func markDeny() []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binary.NativeEndian.AppendUint32(nil, markDenied)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		&expr.Verdict{Kind: expr.VerdictReturn},
	}
}

func nflog(prefix string) expr.Any {
	return &expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN, Group: nflogGroup, Snaplen: 64, Data: []byte(prefix)}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func goTo(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain} }
