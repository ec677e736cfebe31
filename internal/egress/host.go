package egress

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/ns"
)

// Config configures a host's egress.
type Config struct {
	// ID names this daemon's objects in the uplink namespace (its veth,
	// its nftables table), so two daemons on one host do not collide.
	// Derived from the daemon's root directory.
	ID string
	// Range holds the sandboxes' addresses, the router's gateway (the
	// first address) and the uplink link (the last four).
	Range netip.Prefix
	// Uplink is the network namespace egress leaves through: "" for the
	// daemon's own (the host's), else a name under /run/netns or a path.
	Uplink string
	// DNS are the upstream resolvers ("ip:port"; a bare ip means port
	// 53). Empty: the nameservers of the daemon's /etc/resolv.conf.
	DNS []string
	// UpstreamRoots are the roots the proxy trusts for the world's TLS
	// when it inspects (nil: the system's).
	UpstreamRoots *x509.CertPool
	Ledger        Ledger
	Log           *slog.Logger
}

// DefaultRange is the sandboxes' address range when none is configured.
var DefaultRange = netip.MustParsePrefix("10.201.0.0/16")

// proxyPort is the port, on the gateway address in the router
// namespace, that sandboxes' TCP is redirected to.
const proxyPort = 15001

// Host is a daemon's egress: the router namespace, its uplink, the proxy
// and DNS server in it, and the sandboxes' veths.
type Host struct {
	cfg Config
	log *slog.Logger

	names Names

	mu sync.Mutex
	// +checklocks:mu
	started bool
	// +checklocks:mu
	router *os.File // the router network namespace
	// +checklocks:mu
	rh *netlink.Handle // netlink in the router namespace
	// +checklocks:mu
	uplinkNS *os.File
	// +checklocks:mu
	hostMode bool
	// +checklocks:mu
	forwardWas string // the uplink's net.ipv4.ip_forward before molt set it
	// +checklocks:mu
	denied []netip.Prefix // the host's own addresses
	// +checklocks:mu
	proxy *Proxy
	// +checklocks:mu
	dns *DNS
	// +checklocks:mu
	closers []func()
	// +checklocks:mu
	sbs map[string]*sbNet // by sandbox ID
	// +checklocks:mu
	byAddr map[netip.Addr]*sbNet
	// +checklocks:mu
	seq uint32 // names veths

	// What the proxy's, DNS server's and flow log's handlers read: a
	// lock of its own, since Close holds mu while it waits for them.
	// Lock order: mu, then srvMu.
	srvMu sync.RWMutex
	// +checklocks:srvMu
	srvAddr map[netip.Addr]*Endpoint
	// +checklocks:srvMu
	srvRouter *os.File
	// +checklocks:srvMu
	srvDenied []netip.Prefix
}

// sbNet is one sandbox's network.
type sbNet struct {
	ep *Endpoint
	// links by the inode of the sandbox-side network namespace: the live
	// tree's and its standbys'.
	links  map[uint64]*link
	active uint64 // inode of the live tree's namespace
}

// link is a veth between the router and one network namespace of a
// sandbox's.
type link struct {
	name  string // router side
	index int    // its interface index in the router
	addr  netip.Addr
}

// NewHost returns a host's egress; nothing changes on the host until
// the first sandbox with egress joins.
func NewHost(cfg Config) *Host {
	if !cfg.Range.IsValid() {
		cfg.Range = DefaultRange
	}
	cfg.Range = cfg.Range.Masked()
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Host{cfg: cfg, log: cfg.Log, sbs: map[string]*sbNet{}, byAddr: map[netip.Addr]*sbNet{}}
}

// HostID derives a Config.ID from a daemon's root directory.
func HostID(root string) string {
	s := sha256.Sum256([]byte(filepath.Clean(root)))
	return hex.EncodeToString(s[:3])
}

// Gateway is the address sandboxes use as their router and resolver.
func (h *Host) Gateway() netip.Addr { return h.cfg.Range.Addr().Next() }

// Range is the sandboxes' address range.
func (h *Host) Range() netip.Prefix { return h.cfg.Range }

// Names is what sandboxes resolved through molt's DNS.
func (h *Host) Names() *Names { return &h.names }

// uplinkAddrs are the uplink link's addresses: the uplink side's and
// the router's, the last /30 of the range.
func (h *Host) uplinkAddrs() (uplink, router netip.Addr) {
	last := lastAddr(h.cfg.Range)
	router = last.Prev()
	return router.Prev(), router
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= ^uint32(0) >> p.Bits()
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Assignable reports whether a is a sandbox's address in this host's
// range: not the gateway's, nor in the uplink's link. An address another
// host gave (a sandbox that migrated here) may not be.
func (h *Host) Assignable(a netip.Addr) bool {
	up, _ := h.uplinkAddrs()
	return a.Is4() && h.cfg.Range.Contains(a) && h.Gateway().Less(a) && a.Less(up.Prev())
}

// Alloc returns the lowest address of the range no sandbox in used has.
func (h *Host) Alloc(used map[netip.Addr]bool) (netip.Addr, error) {
	up, _ := h.uplinkAddrs()
	for a := h.Gateway().Next(); h.cfg.Range.Contains(a) && a.Less(up.Prev()); a = a.Next() {
		if !used[a] {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("egress: no free address in %v", h.cfg.Range)
}

// MAC is the hardware address of a sandbox's interface: it follows from
// its address, so forks (other addresses) never share one.
func MAC(a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{0x02, 0x6d, b[0], b[1], b[2], b[3]}
}

func (h *Host) uplinkIface() string { return "mu" + h.cfg.ID }
func (h *Host) tableName() string   { return "molt_" + h.cfg.ID }

// Cleanup removes what an earlier daemon with this configuration left
// in the uplink namespace (its nftables table; its veth went with its
// router namespace, which lives only as long as the daemon). Called at
// start-up.
func (h *Host) Cleanup() error {
	nsf, hostMode, err := h.openUplink()
	if err != nil {
		if h.cfg.Uplink != "" {
			return nil // the uplink namespace is gone: nothing of ours is in it
		}
		return err
	}
	defer nsf.Close()
	var errs []error
	if hostMode {
		errs = append(errs, deleteTable(nsf, h.tableName()))
	}
	errs = append(errs, deleteLinkIn(nsf, h.uplinkIface()))
	return errors.Join(errs...)
}

func deleteLinkIn(nsf *os.File, name string) error {
	hd, err := netlink.NewHandleAt(nsHandle(nsf))
	if err != nil {
		return err
	}
	defer hd.Close()
	l, err := hd.LinkByName(name)
	if err != nil {
		return nil
	}
	return hd.LinkDel(l)
}

// openUplink opens the uplink namespace.
func (h *Host) openUplink() (*os.File, bool, error) {
	if h.cfg.Uplink == "" {
		f, err := os.Open("/proc/self/ns/net")
		return f, true, err
	}
	p := h.cfg.Uplink
	if !strings.Contains(p, "/") {
		p = filepath.Join("/run/netns", p)
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, false, fmt.Errorf("egress uplink %q: %w", h.cfg.Uplink, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil || st.Type != unix.NSFS_MAGIC {
		f.Close()
		return nil, false, fmt.Errorf("egress uplink %q: not a network namespace", h.cfg.Uplink)
	}
	return f, false, nil
}

// start builds the router namespace, its uplink and servers.
//
// +checklocks:h.mu
func (h *Host) start() (err error) {
	if h.started {
		return nil
	}
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
			for i := len(h.closers) - 1; i >= 0; i-- {
				h.closers[i]()
			}
			h.closers = nil
			h.router, h.rh, h.uplinkNS = nil, nil, nil
			h.publish()
		}
	}()
	uplinkNS, hostMode, err := h.openUplink()
	if err != nil {
		return err
	}
	undo = append(undo, func() { uplinkNS.Close() })
	router, rh, err := h.newRouter()
	if err != nil {
		return err
	}
	undo = append(undo, func() { rh.Close(); router.Close() })
	u, err := h.connectUplink(rh, uplinkNS, hostMode)
	undo = append(undo, u...)
	if err != nil {
		return err
	}
	h.denied = append([]netip.Prefix{h.cfg.Range}, hostAddrs()...)
	h.router, h.rh, h.uplinkNS, h.hostMode = router, rh, uplinkNS, hostMode
	h.publish()
	if err := h.applyRules(); err != nil {
		return err
	}
	if err := h.startServers(); err != nil {
		return err
	}
	fl, err := openFlowLog(router)
	if err != nil {
		return err
	}
	go fl.run(h.recordFlow)
	h.closers = append(h.closers, func() { fl.Close() })
	h.started = true
	return nil
}

// newRouter makes the router namespace: forwarding and strict
// reverse-path filtering on, the gateway address on its loopback.
func (h *Host) newRouter() (*os.File, *netlink.Handle, error) {
	router, err := ns.NewNet()
	if err != nil {
		return nil, nil, fmt.Errorf("egress: router namespace: %w", err)
	}
	rh, err := netlink.NewHandleAt(nsHandle(router))
	if err != nil {
		router.Close()
		return nil, nil, err
	}
	fail := func(err error) (*os.File, *netlink.Handle, error) {
		rh.Close()
		router.Close()
		return nil, nil, fmt.Errorf("egress: router namespace: %w", err)
	}
	if err := ns.Do(router, unix.CLONE_NEWNET, func() error {
		for k, v := range map[string]string{
			"ipv4/ip_forward": "1", "ipv4/conf/all/rp_filter": "1", "ipv4/conf/default/rp_filter": "1",
			"ipv4/conf/all/forwarding": "1",
		} {
			if err := os.WriteFile("/proc/sys/net/"+k, []byte(v), 0); err != nil {
				return fmt.Errorf("net.%s: %w", strings.ReplaceAll(k, "/", "."), err)
			}
		}
		return nil
	}); err != nil {
		return fail(err)
	}
	lo, err := rh.LinkByName("lo")
	if err != nil {
		return fail(err)
	}
	if err := rh.AddrAdd(lo, &netlink.Addr{IPNet: ipnet(h.Gateway(), 32)}); err != nil {
		return fail(fmt.Errorf("gateway address: %w", err))
	}
	return router, rh, nil
}

// connectUplink links the router to the uplink namespace (a veth, the
// uplink /30, the router's default route) and, in host mode, turns on
// forwarding and writes molt's table there. undo takes back what was
// done, also on failure.
//
// +checklocks:h.mu
func (h *Host) connectUplink(rh *netlink.Handle, uplinkNS *os.File, hostMode bool) (undo []func(), err error) {
	upAddr, rtAddr := h.uplinkAddrs()
	_ = deleteLinkIn(uplinkNS, h.uplinkIface())
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: h.uplinkIface(), PeerNamespace: netlink.NsFd(int(uplinkNS.Fd()))}
	if err := rh.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("egress: uplink veth: %w", err)
	}
	undo = append(undo, func() { _ = deleteLinkIn(uplinkNS, h.uplinkIface()) })
	up0, err := rh.LinkByName("up0")
	if err != nil {
		return undo, err
	}
	if err := rh.AddrAdd(up0, &netlink.Addr{IPNet: ipnet(rtAddr, 30)}); err != nil {
		return undo, err
	}
	if err := rh.LinkSetUp(up0); err != nil {
		return undo, err
	}
	if err := rh.RouteAdd(&netlink.Route{Gw: upAddr.AsSlice(), LinkIndex: up0.Attrs().Index}); err != nil {
		return undo, fmt.Errorf("egress: router default route: %w", err)
	}
	uh, err := netlink.NewHandleAt(nsHandle(uplinkNS))
	if err != nil {
		return undo, err
	}
	defer uh.Close()
	peer, err := uh.LinkByName(h.uplinkIface())
	if err != nil {
		return undo, err
	}
	if err := uh.AddrAdd(peer, &netlink.Addr{IPNet: ipnet(upAddr, 30)}); err != nil {
		return undo, fmt.Errorf("egress: uplink address: %w", err)
	}
	if err := uh.LinkSetUp(peer); err != nil {
		return undo, err
	}
	if !hostMode {
		return undo, nil
	}
	was, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		return undo, err
	}
	h.forwardWas = strings.TrimSpace(string(was))
	if h.forwardWas != "1" {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0); err != nil {
			return undo, fmt.Errorf("egress: net.ipv4.ip_forward: %w", err)
		}
		prev := h.forwardWas
		undo = append(undo, func() { _ = os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte(prev), 0) })
	}
	if err := hostRules(uplinkNS, h.tableName(), h.uplinkIface(), rtAddr); err != nil {
		return undo, err
	}
	undo = append(undo, func() { _ = deleteTable(uplinkNS, h.tableName()) })
	return undo, nil
}

// hostAddrs are the daemon's own addresses, denied to sandboxes by
// default.
func hostAddrs() []netip.Prefix {
	var out []netip.Prefix
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
			}
		}
	}
	return out
}

// applyRules writes the router's ruleset for the sandboxes there are.
//
// +checklocks:h.mu
func (h *Host) applyRules() error {
	rs := ruleset{rng: h.cfg.Range, gateway: h.Gateway(), proxyPort: proxyPort, uplink: "up0", denied: h.denied}
	for _, s := range h.sbs {
		rs.sandboxes = append(rs.sandboxes, sbRules{addr: s.ep.Addr, policy: s.ep.Policy, bypass: s.ep.Bypass})
	}
	return rs.apply(h.router)
}

// publish hands the servers the current endpoints, router and denied
// ranges.
//
// +checklocks:h.mu
func (h *Host) publish() {
	addrs := make(map[netip.Addr]*Endpoint, len(h.byAddr))
	for a, s := range h.byAddr {
		addrs[a] = s.ep
	}
	h.srvMu.Lock()
	h.srvAddr, h.srvRouter, h.srvDenied = addrs, h.router, h.denied
	h.srvMu.Unlock()
}

// dial dials the world from the router namespace.
func (h *Host) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	h.srvMu.RLock()
	router := h.srvRouter
	h.srvMu.RUnlock()
	if router == nil {
		return nil, errors.New("egress is stopped")
	}
	var c net.Conn
	err := ns.Do(router, unix.CLONE_NEWNET, func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// lookup finds the sandbox behind a source address.
func (h *Host) lookup(src netip.Addr) (*Endpoint, bool) {
	h.srvMu.RLock()
	defer h.srvMu.RUnlock()
	ep, ok := h.srvAddr[src.Unmap()]
	return ep, ok
}

// Close removes everything of molt's from the uplink namespace and
// drops the router namespace (and with it every sandbox's veth).
func (h *Host) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.started {
		return nil
	}
	for i := len(h.closers) - 1; i >= 0; i-- {
		h.closers[i]()
	}
	h.closers = nil
	var errs []error
	// Each veth first, so nothing waits for the namespace's teardown.
	if links, err := h.rh.LinkList(); err == nil {
		for _, l := range links {
			if l.Type() == "veth" {
				errs = append(errs, h.rh.LinkDel(l))
			}
		}
	}
	h.rh.Close()
	if h.hostMode {
		errs = append(errs, deleteTable(h.uplinkNS, h.tableName()))
		if h.forwardWas != "" && h.forwardWas != "1" {
			errs = append(errs, os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte(h.forwardWas), 0))
		}
	}
	errs = append(errs, deleteLinkIn(h.uplinkNS, h.uplinkIface()))
	h.router.Close()
	h.uplinkNS.Close()
	h.router, h.rh, h.uplinkNS, h.started = nil, nil, nil, false
	h.publish()
	for _, s := range h.sbs {
		s.links, s.active = map[uint64]*link{}, 0
	}
	return errors.Join(errs...)
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
}

// probe is the memoized result of Probe.
var probe struct {
	once sync.Once
	err  error
}

// Probe checks that this host can give sandboxes egress: a network
// namespace with a veth and an nftables table of molt's (created and
// dropped at once, on the first call).
func (h *Host) Probe() error {
	probe.once.Do(func() {
		f, err := ns.NewNet()
		if err != nil {
			probe.err = err
			return
		}
		defer f.Close()
		rs := ruleset{rng: h.cfg.Range, gateway: h.Gateway(), proxyPort: proxyPort, uplink: "up0"}
		if err := rs.apply(f); err != nil {
			probe.err = err
			return
		}
		hd, err := netlink.NewHandleAt(nsHandle(f))
		if err != nil {
			probe.err = err
			return
		}
		defer hd.Close()
		if err := hd.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "probe0"}, PeerName: "probe1"}); err != nil {
			probe.err = fmt.Errorf("veth: %w", err)
		}
	})
	return probe.err
}

// Describe says how sandboxes' egress leaves this host.
func (h *Host) Describe() string {
	up := "the host's default route (masqueraded)"
	if h.cfg.Uplink != "" {
		up = "network namespace " + h.cfg.Uplink
	}
	return fmt.Sprintf("router namespace with nftables, transparent proxy and DNS on %v; addresses %v; egress through %s", h.Gateway(), h.cfg.Range, up)
}
