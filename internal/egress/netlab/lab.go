// Package netlab is the internet of molt's tests and benchmarks: a
// network namespace holding web, file, payment and DNS servers at fixed
// documentation addresses (RFC 5737), served from the calling process.
// Tests never send a packet beyond the machine; this is where their
// traffic goes instead. The namespace is mounted at /run/netns/<Name>,
// as `ip netns add` would, so the daemon can use it as its uplink
// (`--egress-uplink <Name>`) and `ip netns exec` can look inside.
//
// The lab's addresses are /32s on its loopback; reverse-path filtering
// is off, so it answers traffic to them arriving on any interface (the
// veth molt adds), given a route back to the sender.
package netlab

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/ns"
)

// Names of the lab's hosts, answered by its DNS server.
const (
	WebName   = "web.lab.test"
	PayName   = "pay.lab.test"
	OtherName = "other.lab.test" // a host tests deny, by CIDR or by domain
	FilesName = "files.lab.test"
	// AliasName is a CNAME to WebName, for following CNAME chains.
	AliasName = "alias.lab.test"
	// Zone is the lab's DNS zone; names in it not listed are NXDOMAIN.
	Zone = "lab.test"
)

// Addresses of the lab's hosts.
const (
	WebIP   = "203.0.113.10"
	PayIP   = "203.0.113.11"
	OtherIP = "203.0.113.12"
	FilesIP = "203.0.113.13"
	DNSIP   = "198.51.100.53"
)

// Ports of the raw echo services on WebIP.
const (
	TCPEchoPort = 7
	UDPEchoPort = 9
)

// RunDir is where network namespaces are mounted by name.
const RunDir = "/run/netns"

const defaultPrefix = "molt-lab-"

// removeStale unmounts and removes the default-named labs of processes
// that no longer exist (a test killed before its Close). Labs of live
// processes, other test binaries running at the same time included,
// are left alone.
func removeStale() {
	ents, err := os.ReadDir(RunDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), defaultPrefix)
		pid, _, ok2 := strings.Cut(rest, "-")
		n, err := strconv.Atoi(pid)
		if !ok || !ok2 || err != nil || n <= 0 {
			continue
		}
		if err := unix.Kill(n, 0); !errors.Is(err, unix.ESRCH) {
			continue
		}
		(&Lab{Path: filepath.Join(RunDir, e.Name())}).unmount()
	}
}

// Options configure Start.
type Options struct {
	// Name of the namespace under RunDir; "molt-lab-<pid>-<random>"
	// when "" (such labs left by a process that died without Close are
	// removed by the next Start).
	Name string
	// Dir holds the CA file; a new temporary directory (removed by
	// Close) when "".
	Dir string
	// Hosts are further A records the lab's DNS answers (name to
	// address), for tests that need names of their own.
	Hosts map[string]netip.Addr
}

// Lab is a running test internet. Close it.
type Lab struct {
	Name   string
	Path   string // RunDir/Name
	CAPEM  []byte // the lab CA's certificate, PEM
	CAFile string // CAPEM's file

	netns *os.File
	hosts map[string]netip.Addr // lower-case names, no trailing dot
	certs *certs

	pays atomic.Int64
	ref  refunds // the payment service's refunds (refund.go)
	mu   sync.Mutex
	// +checklocks:mu
	hold *hold
	// +checklocks:mu
	extra []io.Closer   // test listeners (Listen), closed by Close
	done  chan struct{} // closed by Close: releases held payments

	// closers undo Start's steps, in reverse order, on failure or Close.
	closers   []func() error
	wg        sync.WaitGroup // serving goroutines
	closeOnce sync.Once
	closeErr  error
}

// Start creates the lab's namespace, mounts it at RunDir/Name and starts
// its servers. Preconditions: root (CAP_SYS_ADMIN, CAP_NET_ADMIN).
func Start(opts Options) (_ *Lab, err error) {
	name := opts.Name
	if name == "" {
		removeStale()
		var b [4]byte
		rand.Read(b[:])
		name = fmt.Sprintf("%s%d-%s", defaultPrefix, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if len(name) > 64 || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return nil, fmt.Errorf("lab name %q: want a file name of at most 64 bytes", name)
	}
	l := &Lab{Name: name, Path: filepath.Join(RunDir, name), done: make(chan struct{}), hosts: map[string]netip.Addr{}}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	for n, a := range defaultHosts {
		l.hosts[n] = a
	}
	for n, a := range opts.Hosts {
		if !a.Is4() {
			return nil, fmt.Errorf("lab host %s: address %v is not IPv4", n, a)
		}
		l.hosts[strings.ToLower(strings.TrimSuffix(n, "."))] = a
	}

	if err := l.writeCA(opts.Dir); err != nil {
		return nil, err
	}
	if l.netns, err = ns.NewNet(); err != nil {
		return nil, fmt.Errorf("lab namespace: %w", err)
	}
	l.closers = append(l.closers, l.netns.Close)
	if err := l.mount(); err != nil {
		return nil, err
	}
	l.closers = append(l.closers, l.unmount)
	if err := ns.Do(l.netns, unix.CLONE_NEWNET, l.setup); err != nil {
		return nil, fmt.Errorf("lab %s: %w", name, err)
	}
	return l, nil
}

// Close stops the servers, releases held payments, and unmounts and
// removes the namespace. It is idempotent.
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		close(l.done)
		extra := l.extra
		l.mu.Unlock()
		for _, c := range extra {
			c.Close()
		}
		var errs []error
		for i := len(l.closers) - 1; i >= 0; i-- {
			if err := l.closers[i](); err != nil {
				errs = append(errs, err)
			}
		}
		l.wg.Wait()
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// DNSAddr is the lab's DNS server (UDP and TCP).
func (l *Lab) DNSAddr() netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(DNSIP), 53) }

// Lookup returns the address the lab's DNS gives name (no CNAMEs).
func (l *Lab) Lookup(name string) (netip.Addr, bool) {
	a, ok := l.hosts[strings.ToLower(strings.TrimSuffix(name, "."))]
	return a, ok
}

// NetNS returns the lab's namespace; it stays open until Close.
func (l *Lab) NetNS() *os.File { return l.netns }

// mount bind-mounts the namespace on an empty file at l.Path, as `ip
// netns add` does. RunDir is not made a shared mount: molt's daemon and
// tests share the host's mount namespace, where the mount is visible.
func (l *Lab) mount() error {
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return err
	}
	fd, err := unix.Open(l.Path, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("lab %s: %w", l.Path, err)
	}
	unix.Close(fd)
	src := fmt.Sprintf("/proc/self/fd/%d", l.netns.Fd())
	if err := unix.Mount(src, l.Path, "", unix.MS_BIND, ""); err != nil {
		os.Remove(l.Path)
		return fmt.Errorf("mount lab namespace on %s: %w", l.Path, err)
	}
	return nil
}

func (l *Lab) unmount() error {
	if err := unix.Unmount(l.Path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", l.Path, err)
	}
	if err := os.Remove(l.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// setup runs on a thread in the lab's namespace: addresses, sysctls and
// every listener (a socket stays in the namespace it was made in).
func (l *Lab) setup() error {
	for name, v := range map[string]string{
		"conf/all/rp_filter":     "0",
		"conf/default/rp_filter": "0",
	} {
		if err := os.WriteFile("/proc/sys/net/ipv4/"+name, []byte(v), 0); err != nil {
			return fmt.Errorf("net.ipv4.%s: %w", strings.ReplaceAll(name, "/", "."), err)
		}
	}
	addrs := map[netip.Addr]bool{netip.MustParseAddr(DNSIP): true}
	for _, a := range l.hosts {
		addrs[a] = true
	}
	for a := range addrs {
		if err := addLoopback(a); err != nil {
			return err
		}
	}
	return l.listen()
}

// addLoopback adds a/32 to the loopback interface of the calling
// thread's namespace.
func addLoopback(a netip.Addr) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	ipn := &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}
	if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: ipn}); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add %v/32 to lo: %w", a, err)
	}
	return nil
}
