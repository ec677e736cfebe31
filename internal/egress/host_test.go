package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/ns"
	"github.com/molt-sh/molt/internal/testutil"
)

// world is an uplink namespace with one TCP server on 203.0.113.10:80,
// for the plumbing tests.
func world(t testing.TB) (*os.File, string) {
	t.Helper()
	requireNet(t)
	f, err := ns.NewNet()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	err = ns.Do(f, unix.CLONE_NEWNET, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: ipnet(netip.MustParseAddr("203.0.113.10"), 32)})
	})
	if err != nil {
		t.Fatal(err)
	}
	return f, fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
}

// requireNet skips (or, in CI, fails) a test where this host cannot
// make a router namespace: root, veths and nftables.
func requireNet(t testing.TB) {
	t.Helper()
	testutil.RequireRoot(t)
	if err := NewHost(Config{}).Probe(); err != nil {
		testutil.Unavailable(t, "egress: "+err.Error())
	}
}

// dialFrom connects to addr from network namespace f.
func dialFrom(f *os.File, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(f, unix.CLONE_NEWNET, func() error {
		var err error
		c, err = net.DialTimeout("tcp4", addr, 3*time.Second)
		return err
	})
	return c, err
}

// flowRecords collects what the host records of flows.
type flowRecords struct {
	mu sync.Mutex
	rs []ledger.Record
}

func (f *flowRecords) Begin(sb string, r ledger.Record) (ledger.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r.Sandbox = sb
	f.rs = append(f.rs, r)
	return r, nil
}

func (f *flowRecords) Finish(sb, id string, state ledger.State, resp *ledger.Response, errText string) (ledger.Record, error) {
	return ledger.Record{}, errors.New("not here")
}

func (f *flowRecords) Match(sb string, id ledger.Identity) ledger.Match { return ledger.Match{} }

func (f *flowRecords) wait(t *testing.T, pred func(ledger.Record) bool) ledger.Record {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		f.mu.Lock()
		for _, r := range f.rs {
			if pred(r) {
				f.mu.Unlock()
				return r
			}
		}
		f.mu.Unlock()
	}
	t.Fatalf("no such record in %+v", f.rs)
	return ledger.Record{}
}

func TestHostPlumbing(t *testing.T) {
	up, upPath := world(t)
	recs := &flowRecords{}
	h := NewHost(Config{ID: "t0", Uplink: upPath, Ledger: recs})
	ep := &Endpoint{ID: "sb1", Addr: netip.MustParseAddr("10.201.0.2"), Policy: Policy{DenyCIDRs: []netip.Prefix{netip.MustParsePrefix("203.0.113.12/32")}}}
	if err := h.Add(ep); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	sbNS, err := ns.NewNet()
	if err != nil {
		t.Fatal(err)
	}
	defer sbNS.Close()
	if err := h.ActivateNS("sb1", sbNS); err != nil {
		t.Fatal(err)
	}
	// The sandbox's TCP reaches the proxy (which here accepts into its
	// backlog only): connect succeeds, whatever the destination says.
	c, err := dialFrom(sbNS, "203.0.113.10:80")
	if err != nil {
		t.Fatalf("connect through the router: %v", err)
	}
	c.Close()
	// A denied range is refused at once, by policy and by default.
	for _, a := range []string{"203.0.113.12:80", "10.0.0.1:80", "169.254.169.254:80"} {
		_, err := dialFrom(sbNS, a)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("connect to %s: %v, want connection refused", a, err)
		}
		// ... and recorded, with the reason.
		r := recs.wait(t, func(r ledger.Record) bool { return r.Request.Addr == a })
		if r.Sandbox != "sb1" || r.State != ledger.Denied || r.Kind != ledger.Opaque || r.Request.Proto != "tcp" || r.Error == "" {
			t.Errorf("record of the refused connection to %s: %+v", a, r)
		}
	}
	// UDP (not DNS) is forwarded, and recorded per flow.
	err = ns.Do(sbNS, unix.CLONE_NEWNET, func() error {
		c, err := net.Dial("udp4", "203.0.113.10:9")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("ping"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if r := recs.wait(t, func(r ledger.Record) bool { return r.Request.Addr == "203.0.113.10:9" }); r.State != ledger.Completed || r.Request.Proto != "udp" {
		t.Errorf("UDP flow record: %+v", r)
	}
	// A second sandbox cannot reach the first, nor spoof its address.
	ep2 := &Endpoint{ID: "sb2", Addr: netip.MustParseAddr("10.201.0.3")}
	if err := h.Add(ep2); err != nil {
		t.Fatal(err)
	}
	sb2, err := ns.NewNet()
	if err != nil {
		t.Fatal(err)
	}
	defer sb2.Close()
	if err := h.ActivateNS("sb2", sb2); err != nil {
		t.Fatal(err)
	}
	if _, err := dialFrom(sb2, "10.201.0.2:22"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("sandbox to sandbox: %v, want connection refused", err)
	}
	// Removing a sandbox removes its veth.
	if err := h.Remove("sb2"); err != nil {
		t.Fatal(err)
	}
	var links int
	_ = ns.Do(sb2, unix.CLONE_NEWNET, func() error {
		l, _ := netlink.LinkList()
		links = len(l)
		return nil
	})
	if links != 1 {
		t.Errorf("removed sandbox's namespace has %d links, want only lo", links)
	}
	// Close leaves nothing in the uplink namespace.
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	_ = ns.Do(up, unix.CLONE_NEWNET, func() error {
		if _, err := netlink.LinkByName(h.uplinkIface()); err == nil {
			t.Errorf("uplink veth %s left after Close", h.uplinkIface())
		}
		return nil
	})
}

// TestHostRules: in host mode molt's only change to the host's firewall
// is a table of its own, which Cleanup and Close delete (here in a
// namespace standing in for the host's).
func TestHostRules(t *testing.T) {
	requireNet(t)
	f, err := ns.NewNet()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	count := func() (tables, rules int) {
		c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseLasting()
		ts, err := c.ListTables()
		if err != nil {
			t.Fatal(err)
		}
		for _, tb := range ts {
			tables++
			chains, _ := c.ListChainsOfTableFamily(tb.Family)
			for _, ch := range chains {
				if ch.Table.Name == tb.Name {
					rs, _ := c.GetRules(tb, ch)
					rules += len(rs)
				}
			}
		}
		return tables, rules
	}
	if err := hostRules(f, "molt_t1", "mut1", netip.MustParseAddr("10.201.255.254")); err != nil {
		t.Fatal(err)
	}
	// Again: replaced, not doubled.
	if err := hostRules(f, "molt_t1", "mut1", netip.MustParseAddr("10.201.255.254")); err != nil {
		t.Fatal(err)
	}
	if tb, r := count(); tb != 1 || r != 3 {
		t.Fatalf("%d tables, %d rules; want molt's one table with its 3 rules", tb, r)
	}
	if err := deleteTable(f, "molt_t1"); err != nil {
		t.Fatal(err)
	}
	if tb, r := count(); tb != 0 || r != 0 {
		t.Fatalf("after delete: %d tables, %d rules", tb, r)
	}
	// Deleting what is not there is no error (start-up cleanup).
	if err := deleteTable(f, "molt_t1"); err != nil {
		t.Fatal(err)
	}
}

// TestHostBypass: a benchmark's bypassed sandbox reaches the world by
// NAT alone, past the proxy, while a recorded one beside it still goes
// to the proxy.
func TestHostBypass(t *testing.T) {
	up, upPath := world(t)
	h := NewHost(Config{ID: "t1", Uplink: upPath, Ledger: &flowRecords{}})
	defer h.Close()
	for _, ep := range []*Endpoint{
		{ID: "direct", Addr: netip.MustParseAddr("10.201.0.2"), Bypass: true},
		{ID: "recorded", Addr: netip.MustParseAddr("10.201.0.3")},
	} {
		if err := h.Add(ep); err != nil {
			t.Fatal(err)
		}
	}
	sbs := map[string]*os.File{}
	for _, id := range []string{"direct", "recorded"} {
		f, err := ns.NewNet()
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := h.ActivateNS(id, f); err != nil {
			t.Fatal(err)
		}
		sbs[id] = f
	}
	// Nothing listens on port 81 in the world: the bypassed sandbox
	// sees the world's refusal (the proxy would have accepted).
	if _, err := dialFrom(sbs["direct"], "203.0.113.10:81"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("bypassed sandbox to a closed port: %v, want connection refused from the world", err)
	}
	if c, err := dialFrom(sbs["recorded"], "203.0.113.10:81"); err != nil {
		t.Errorf("recorded sandbox to a closed port: %v, want the proxy's accept", err)
	} else {
		c.Close()
	}
	// With a listener there, the connection arrives from the router's
	// uplink address (masqueraded), not from the proxy's.
	var ln net.Listener
	if err := ns.Do(up, unix.CLONE_NEWNET, func() error {
		var err error
		ln, err = net.Listen("tcp4", "203.0.113.10:81")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := dialFrom(sbs["direct"], "203.0.113.10:81")
	if err != nil {
		t.Fatalf("bypassed sandbox to a listener: %v", err)
	}
	defer c.Close()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	_, rt := h.uplinkAddrs()
	if got := sc.RemoteAddr().(*net.TCPAddr).IP.String(); got != rt.String() {
		t.Errorf("world saw the bypassed connection from %s, want the router's uplink address %s", got, rt)
	}
	// The world's refusal of a denied range still holds for the
	// recorded sandbox, whose rules the bypass did not disturb.
	if _, err := dialFrom(sbs["recorded"], "10.0.0.1:80"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("recorded sandbox to a denied range: %v, want connection refused", err)
	}
}

// TestHostReaddress: a namespace prepared for one sandbox (a standby)
// that another adopts (a fork) keeps its veth and takes the adopter's
// address and MAC, and the adopter's traffic flows through it.
func TestHostReaddress(t *testing.T) {
	_, upPath := world(t)
	h := NewHost(Config{ID: "t2", Uplink: upPath})
	defer h.Close()
	parent := &Endpoint{ID: "parent", Addr: netip.MustParseAddr("10.201.0.2")}
	fork := &Endpoint{ID: "fork", Addr: netip.MustParseAddr("10.201.0.3")}
	for _, ep := range []*Endpoint{parent, fork} {
		if err := h.Add(ep); err != nil {
			t.Fatal(err)
		}
	}
	standby, err := ns.NewNet()
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close()
	if err := h.Prepare("parent", standby, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	before := h.links("parent")
	if err := h.ActivateNS("fork", standby); err != nil {
		t.Fatal(err)
	}
	if after := h.links("fork"); len(before) != 1 || len(after) != 1 || after[0] != before[0] {
		t.Errorf("veths before %v, after %v: want the same one, moved", before, after)
	}
	if l := h.links("parent"); len(l) != 0 {
		t.Errorf("parent still has %v", l)
	}
	err = ns.Do(standby, unix.CLONE_NEWNET, func() error {
		in, err := netlink.LinkByName(sandboxIface)
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(in, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		if len(addrs) != 1 || !addrs[0].IP.Equal(fork.Addr.AsSlice()) {
			t.Errorf("addresses %v, want only %v", addrs, fork.Addr)
		}
		if in.Attrs().HardwareAddr.String() != MAC(fork.Addr).String() {
			t.Errorf("MAC %v, want %v", in.Attrs().HardwareAddr, MAC(fork.Addr))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := dialFrom(standby, "203.0.113.10:80"); err != nil {
		t.Fatalf("the fork's traffic: %v", err)
	} else {
		c.Close()
	}
}

// links names sandbox id's veths.
func (h *Host) links(id string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	if s := h.sbs[id]; s != nil {
		for _, l := range s.links {
			out = append(out, l.name)
		}
	}
	return out
}

// TestHostCloseWithTraffic: Close, which waits for the proxy's handlers,
// returns while sandboxes keep connecting (the handlers must not need
// the lock Close holds).
func TestHostCloseWithTraffic(t *testing.T) {
	_, upPath := world(t)
	h := NewHost(Config{ID: "t3", Uplink: upPath, Ledger: &flowRecords{}})
	ep := &Endpoint{ID: "sb", Addr: netip.MustParseAddr("10.201.0.2")}
	if err := h.Add(ep); err != nil {
		t.Fatal(err)
	}
	sbNS, err := ns.NewNet()
	if err != nil {
		t.Fatal(err)
	}
	defer sbNS.Close()
	if err := h.ActivateNS("sb", sbNS); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if c, err := dialFrom(sbNS, "203.0.113.10:80"); err == nil {
					c.Close()
				}
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- h.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return with connections arriving")
	}
	close(stop)
	wg.Wait()
}

// TestHostStaleLink: a namespace's inode can be a dead one's (the
// kernel reuses them): a veth remembered for that inode that no longer
// exists is not taken for the namespace's, which gets a new one. The
// test stands for a reused inode by deleting the veth behind the
// host's back.
func TestHostStaleLink(t *testing.T) {
	_, upPath := world(t)
	h := NewHost(Config{ID: "t5", Uplink: upPath})
	defer h.Close()
	ep := &Endpoint{ID: "sb", Addr: netip.MustParseAddr("10.201.0.2")}
	if err := h.Add(ep); err != nil {
		t.Fatal(err)
	}
	tree, err := ns.NewNet()
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	if err := h.ActivateNS("sb", tree); err != nil {
		t.Fatal(err)
	}
	old := h.links("sb")
	h.mu.Lock()
	err = h.deleteLink(old[0])
	h.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.ActivateNS("sb", tree); err != nil {
		t.Fatalf("activate after the veth went: %v", err)
	}
	if now := h.links("sb"); len(now) != 1 || now[0] == old[0] {
		t.Fatalf("veths %v, was %v: want a new one", now, old)
	}
	if c, err := dialFrom(tree, "203.0.113.10:80"); err != nil {
		t.Fatalf("traffic on the new veth: %v", err)
	} else {
		c.Close()
	}
}

// TestHostBindOnly: a restore's namespace prepared with the address the
// images were dumped with (a fork's parent's, another host's) can bind
// it, never sends from it, and loses it once the restore is settled.
func TestHostBindOnly(t *testing.T) {
	_, upPath := world(t)
	h := NewHost(Config{ID: "t4", Uplink: upPath, Ledger: &flowRecords{}})
	defer h.Close()
	ep := &Endpoint{ID: "sb", Addr: netip.MustParseAddr("10.201.0.9")}
	if err := h.Add(ep); err != nil {
		t.Fatal(err)
	}
	restore, err := ns.NewNet()
	if err != nil {
		t.Fatal(err)
	}
	defer restore.Close()
	dumped := netip.MustParseAddr("10.210.0.2")
	if err := h.Prepare("sb", restore, dumped); err != nil {
		t.Fatal(err)
	}
	bind := func() error {
		return ns.Do(restore, unix.CLONE_NEWNET, func() error {
			l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: dumped.AsSlice()})
			if err == nil {
				l.Close()
			}
			return err
		})
	}
	if err := bind(); err != nil {
		t.Fatalf("bind the images' address after Prepare: %v", err)
	}
	if err := h.ActivateNS("sb", restore); err != nil {
		t.Fatal(err)
	}
	c, err := dialFrom(restore, "203.0.113.10:80")
	if err != nil {
		t.Fatalf("the restored tree's traffic: %v", err)
	}
	if got := c.LocalAddr().(*net.TCPAddr).IP.String(); got != ep.Addr.String() {
		t.Errorf("a connection from the restored tree has source %s, want the sandbox's %v", got, ep.Addr)
	}
	c.Close()
	if err := dropBindOnly(restore); err != nil {
		t.Fatal(err)
	}
	if err := bind(); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Fatalf("bind the images' address once settled: %v, want EADDRNOTAVAIL", err)
	}
	if c, err := dialFrom(restore, "203.0.113.10:80"); err != nil {
		t.Fatalf("the sandbox's traffic once settled: %v", err)
	} else {
		c.Close()
	}
}
