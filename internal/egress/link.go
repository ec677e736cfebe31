package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/ns"
)

func nsHandle(f *os.File) netns.NsHandle { return netns.NsHandle(int(f.Fd())) }

// sandboxIface is the interface's name inside a sandbox.
const sandboxIface = "eth0"

// Add makes sandbox ep.ID known (building the router namespace on first
// use) and rewrites the ruleset for its policy. Add again replaces the
// endpoint (a policy change).
func (h *Host) Add(ep *Endpoint) error {
	if !ep.Addr.Is4() || !h.cfg.Range.Contains(ep.Addr) {
		return fmt.Errorf("egress: sandbox %s: address %v is not in %v", ep.ID, ep.Addr, h.cfg.Range)
	}
	if err := ep.Policy.Validate(); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.start(); err != nil {
		return err
	}
	if o, ok := h.byAddr[ep.Addr]; ok && o.ep.ID != ep.ID {
		return fmt.Errorf("egress: address %v is sandbox %s's", ep.Addr, o.ep.ID)
	}
	s := h.sbs[ep.ID]
	if s == nil {
		s = &sbNet{links: map[uint64]*link{}}
		h.sbs[ep.ID] = s
	} else if s.ep.Addr != ep.Addr {
		delete(h.byAddr, s.ep.Addr)
	}
	s.ep = ep
	h.byAddr[ep.Addr] = s
	h.publish()
	return h.applyRules()
}

// Remove forgets sandbox id: its veths and rules go.
func (h *Host) Remove(id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sbs[id]
	if !ok {
		return nil
	}
	delete(h.sbs, id)
	delete(h.byAddr, s.ep.Addr)
	h.publish()
	h.names.Forget(id)
	if !h.started {
		return nil
	}
	var errs []error
	for _, l := range s.links {
		errs = append(errs, h.deleteLink(l.name))
	}
	errs = append(errs, h.applyRules())
	return errors.Join(errs...)
}

// Known reports whether sandbox id has egress here.
func (h *Host) Known(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.sbs[id]
	return ok
}

func inode(f *os.File) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// Prepare gives the network namespace netns a veth for sandbox id, with
// the sandbox's address, routes and MAC inside, not yet routed to from
// the router: a restore into netns can bind the sandbox's address, and a
// standby waits there until Activate.
//
// bind names the address the images to be restored were dumped with,
// if it is not the sandbox's own (a fork's parent's, or the address the
// sandbox had on the host it migrated from): their sockets bind it, and
// IPv4 binds only a local address (CRIU sets IP_FREEBIND for IPv6
// alone). It is added with host scope, so the kernel never picks it as
// a source, and ResetWorld removes it once the tree is restored. Were a
// packet sent from it anyway, the router's strict reverse-path filter
// drops it: the router routes that address to another veth, or to none.
func (h *Host) Prepare(id string, netnsFile *os.File, bind netip.Addr) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	l, err := h.prepare(id, netnsFile)
	if err != nil || !BindOnly(bind, l.addr) {
		return err
	}
	return addBindOnly(netnsFile, bind)
}

// sandboxLink opens a netlink handle in netns and its sandbox interface;
// the caller closes the handle.
func sandboxLink(netnsFile *os.File) (*netlink.Handle, netlink.Link, error) {
	sh, err := netlink.NewHandleAt(nsHandle(netnsFile))
	if err != nil {
		return nil, nil, err
	}
	in, err := sh.LinkByName(sandboxIface)
	if err != nil {
		sh.Close()
		return nil, nil, err
	}
	return sh, in, nil
}

// BindOnly reports whether a restore of images dumped with address
// dumped, for a sandbox whose address is now own, needs Prepare's bind.
func BindOnly(dumped, own netip.Addr) bool { return dumped.Is4() && dumped != own }

// addBindOnly adds a to the sandbox interface of netns with host scope.
func addBindOnly(netnsFile *os.File, a netip.Addr) error {
	sh, in, err := sandboxLink(netnsFile)
	if err != nil {
		return err
	}
	defer sh.Close()
	err = sh.AddrAdd(in, &netlink.Addr{IPNet: ipnet(a, 32), Scope: int(netlink.SCOPE_HOST)})
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("egress: the images' address %v: %w", a, err)
	}
	return nil
}

// dropBindOnly removes the host-scoped addresses of netns's sandbox
// interface (Prepare's bind).
func dropBindOnly(netnsFile *os.File) error {
	sh, in, err := sandboxLink(netnsFile)
	if err != nil {
		return nil // no interface: nothing was added
	}
	defer sh.Close()
	addrs, err := sh.AddrList(in, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	var errs []error
	for _, a := range addrs {
		if a.Scope == int(netlink.SCOPE_HOST) {
			errs = append(errs, sh.AddrDel(in, &a))
		}
	}
	return errors.Join(errs...)
}

// +checklocks:h.mu
func (h *Host) prepare(id string, netnsFile *os.File) (*link, error) {
	s, ok := h.sbs[id]
	if !ok {
		return nil, fmt.Errorf("egress: sandbox %s has no network", id)
	}
	if !h.started {
		if err := h.start(); err != nil {
			return nil, err
		}
	}
	ino, err := inode(netnsFile)
	if err != nil {
		return nil, err
	}
	// A namespace that is alive keeps its veth (only Remove deletes
	// one, and it forgets it). But the kernel reuses a dead namespace's
	// inode: a veth remembered for this inode that is gone was a dead
	// namespace's (a sandbox whose init died takes its namespace and
	// veth with it; the restarted tree's new namespace may get the
	// inode), and is forgotten here.
	if l, ok := s.links[ino]; ok && !h.linkAlive(l) {
		delete(s.links, ino)
		if s.active == ino {
			s.active = 0
		}
	} else if ok && l.addr == s.ep.Addr {
		return l, nil
	}
	// A namespace prepared for another sandbox (a fork adopts its
	// parent's standby) or for an old address takes this sandbox's
	// address and MAC on its veth; if that fails, it gets a new veth
	// (deleting one costs 20-35 ms: the fork's critical path).
	for _, o := range h.sbs {
		if l, ok := o.links[ino]; ok && !h.linkAlive(l) {
			delete(o.links, ino)
			if o.active == ino {
				o.active = 0
			}
		} else if ok {
			delete(o.links, ino)
			if o.active == ino {
				o.active = 0
			}
			if err := readdress(netnsFile, l.addr, s.ep.Addr); err == nil {
				l.addr = s.ep.Addr
				s.links[ino] = l
				_ = h.rh.LinkSetAlias(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: l.name, Index: l.index}}, "molt sandbox "+id)
				return l, nil
			}
			_ = h.deleteLink(l.name)
		}
	}
	h.prune(s)
	h.seq++
	name := fmt.Sprintf("vs%s%04x", h.cfg.ID, h.seq&0xffff)
	rh := h.rh
	sh, err := netlink.NewHandleAt(nsHandle(netnsFile))
	if err != nil {
		return nil, err
	}
	defer sh.Close()
	if old, err := sh.LinkByName(sandboxIface); err == nil {
		_ = sh.LinkDel(old)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: sandboxIface,
		PeerHardwareAddr: MAC(s.ep.Addr), PeerNamespace: netlink.NsFd(int(netnsFile.Fd()))}
	if err := rh.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("egress: veth for %s: %w", id, err)
	}
	l := &link{name: name, addr: s.ep.Addr}
	in, err := sh.LinkByName(sandboxIface)
	if err != nil {
		return h.failLink(id, name, err)
	}
	gw := h.Gateway()
	if err := sh.AddrAdd(in, &netlink.Addr{IPNet: ipnet(s.ep.Addr, 32)}); err != nil {
		return h.failLink(id, name, err)
	}
	if err := sh.LinkSetUp(in); err != nil {
		return h.failLink(id, name, err)
	}
	if err := sh.RouteAdd(&netlink.Route{Dst: ipnet(gw, 32), LinkIndex: in.Attrs().Index, Scope: netlink.SCOPE_LINK}); err != nil {
		return h.failLink(id, name, err)
	}
	if err := sh.RouteAdd(&netlink.Route{Gw: gw.AsSlice(), LinkIndex: in.Attrs().Index}); err != nil {
		return h.failLink(id, name, err)
	}
	out, err := rh.LinkByName(name)
	if err != nil {
		return h.failLink(id, name, err)
	}
	// The alias names the sandbox, for whoever lists the router's links.
	if err := rh.LinkSetAlias(out, "molt sandbox "+id); err != nil {
		return h.failLink(id, name, err)
	}
	if err := rh.LinkSetUp(out); err != nil {
		return h.failLink(id, name, err)
	}
	l.index = out.Attrs().Index
	s.links[ino] = l
	return l, nil
}

// readdress gives the sandbox interface of netns the address to (and
// its MAC) in place of from; its routes stay.
func readdress(netnsFile *os.File, from, to netip.Addr) error {
	sh, in, err := sandboxLink(netnsFile)
	if err != nil {
		return err
	}
	defer sh.Close()
	if err := sh.LinkSetHardwareAddr(in, MAC(to)); err != nil {
		return err
	}
	if err := sh.AddrAdd(in, &netlink.Addr{IPNet: ipnet(to, 32)}); err != nil {
		return err
	}
	if err := sh.AddrDel(in, &netlink.Addr{IPNet: ipnet(from, 32)}); err != nil {
		return err
	}
	return nil
}

// failLink deletes the veth name, half set up for sandbox id.
//
// +checklocks:h.mu
func (h *Host) failLink(id, name string, err error) (*link, error) {
	_ = h.deleteLink(name)
	return nil, fmt.Errorf("egress: veth for %s: %w", id, err)
}

// Activate routes sandbox id's address to the veth of process pid's
// network namespace (preparing one if there is none). The veth of the
// tree it replaces is left to the kernel, which deletes it with that
// tree's namespace: deleting it here would cost the rollback 20-35 ms
// (measured; the kernel waits for RCU grace periods), and without the
// route it carries nothing.
func (h *Host) Activate(id string, pid int) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return fmt.Errorf("egress: sandbox %s: %w", id, err)
	}
	defer f.Close()
	return h.ActivateNS(id, f)
}

// ActivateNS is Activate for the network namespace f.
func (h *Host) ActivateNS(id string, f *os.File) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	l, err := h.prepare(id, f)
	if err != nil {
		return err
	}
	s := h.sbs[id]
	ino, _ := inode(f)
	if err := h.rh.RouteReplace(&netlink.Route{Dst: ipnet(s.ep.Addr, 32), LinkIndex: l.index, Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("egress: route to sandbox %s: %w", id, err)
	}
	s.active = ino
	return nil
}

// ResetWorld destroys the TCP connections to the world of the tree of
// process pid, just restored: their far ends were the proxy's
// connections of the tree that was checkpointed, long gone, and a
// process waiting on one would wait forever; it sees a reset
// (ECONNABORTED) instead. Connections inside the sandbox (loopback) are
// left alone. With bound (Prepare was given the images' address), that
// address goes too. Call it before the tree runs (a standby, a tree
// restored stopped), so no connection it makes afterwards is touched.
func ResetWorld(pid int, bound bool) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return err
	}
	defer f.Close()
	err = resetWorldConns(f)
	if bound {
		err = errors.Join(err, dropBindOnly(f))
	}
	return err
}

// resetWorldConns destroys the TCP sockets of network namespace netns
// whose peer is not in the namespace (not loopback).
func resetWorldConns(netnsFile *os.File) error {
	return ns.Do(netnsFile, unix.CLONE_NEWNET, func() error {
		socks, err := netlink.SocketDiagTCP(unix.AF_INET)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return fmt.Errorf("egress: list sockets: %w", err)
		}
		var errs []error
		for _, s := range socks {
			if s.State == netlink.TCP_LISTEN || s.ID.Destination.IsLoopback() || s.ID.Destination.IsUnspecified() {
				continue
			}
			err := netlink.SocketDestroy(&net.TCPAddr{IP: s.ID.Source, Port: int(s.ID.SourcePort)},
				&net.TCPAddr{IP: s.ID.Destination, Port: int(s.ID.DestinationPort)})
			if err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("egress: reset %v:%d: %w", s.ID.Destination, s.ID.DestinationPort, err))
			}
		}
		return errors.Join(errs...)
	})
}

// +checklocks:h.mu
func (h *Host) linkExists(name string) bool {
	_, err := h.rh.LinkByName(name)
	return err == nil
}

// linkAlive reports whether l's router side still exists (by index
// and name: an index can be reused too).
//
// +checklocks:h.mu
func (h *Host) linkAlive(l *link) bool {
	got, err := h.rh.LinkByIndex(l.index)
	return err == nil && got.Attrs().Name == l.name
}

// prune forgets s's veths whose namespace is gone (a discarded standby:
// the kernel deleted the pair with it).
//
// +checklocks:h.mu
func (h *Host) prune(s *sbNet) {
	for ino, l := range s.links {
		if !h.linkExists(l.name) {
			delete(s.links, ino)
			if s.active == ino {
				s.active = 0
			}
		}
	}
}

// +checklocks:h.mu
func (h *Host) deleteLink(name string) error {
	l, err := h.rh.LinkByName(name)
	if err != nil {
		return nil
	}
	return h.rh.LinkDel(l)
}

// Addrs lists the sandboxes' addresses (tests, reconcile).
func (h *Host) Addrs() map[string]netip.Addr {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]netip.Addr{}
	for id, s := range h.sbs {
		out[id] = s.ep.Addr
	}
	return out
}
