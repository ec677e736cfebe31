package integration

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// The two hosts of the multi-host tests: network namespaces of their
// own on one bridge, which sits in a third namespace; this machine
// reaches the bridge too, as the "network" the hosts share (their object
// store is served to them from here). Nothing leaves the machine.
//
//	host ns (fabricIP) ─┐
//	host A  (hostIPs[0]) ─┤ bridge (namespace "fabric")
//	host B  (hostIPs[1]) ─┘
var (
	fabricIP = net.IPv4(10, 231, 17, 1)
	hostIPs  = []net.IP{net.IPv4(10, 231, 17, 2), net.IPv4(10, 231, 17, 3)}
)

// fabric is the hosts' network.
type fabric struct {
	// netns are the hosts' namespaces, as paths for nsenter --net.
	netns []string
}

// run runs ip (or another command) and fails t with its output.
func runCmd(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// startFabric makes the namespaces, the bridge and the links, and
// removes them when t ends. n hosts, at most len(hostIPs).
func startFabric(t *testing.T, n int) fabric {
	t.Helper()
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("nsenter (util-linux) is not installed")
	}
	tag := fmt.Sprintf("%d", os.Getpid()%100000)
	fab := "molt-fab-" + tag
	runCmd(t, "ip", "netns", "add", fab)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", fab).Run() })
	runCmd(t, "ip", "-n", fab, "link", "set", "lo", "up")
	runCmd(t, "ip", "-n", fab, "link", "add", "br0", "type", "bridge")
	runCmd(t, "ip", "-n", fab, "link", "set", "br0", "up")
	// link makes a veth pair: end in namespace ns ("" for this one) with
	// address ip, the other end on the bridge.
	link := func(name, ns string, ip net.IP) {
		peer := name + "b"
		runCmd(t, "ip", "link", "add", name, "type", "veth", "peer", "name", peer)
		t.Cleanup(func() { _ = exec.Command("ip", "link", "del", name).Run() })
		runCmd(t, "ip", "link", "set", peer, "netns", fab)
		runCmd(t, "ip", "-n", fab, "link", "set", peer, "master", "br0", "up")
		ipn := []string{}
		if ns != "" {
			runCmd(t, "ip", "link", "set", name, "netns", ns)
			ipn = []string{"-n", ns}
		}
		runCmd(t, "ip", append(ipn, "addr", "add", ip.String()+"/24", "dev", name)...)
		runCmd(t, "ip", append(ipn, "link", "set", name, "up")...)
	}
	link("mf"+tag, "", fabricIP)
	f := fabric{}
	for i := range n {
		ns := fmt.Sprintf("molt-host%c-%s", 'a'+i, tag)
		runCmd(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		runCmd(t, "ip", "-n", ns, "link", "set", "lo", "up")
		link(fmt.Sprintf("m%c%s", 'a'+i, tag), ns, hostIPs[i])
		f.netns = append(f.netns, "/run/netns/"+ns)
	}
	return f
}

// forward serves addr (host:port, reachable from here only) on the
// fabric, and returns the address the hosts reach it at. It stops when
// t ends.
func forward(t *testing.T, addr string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(fabricIP.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
	)
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				d, err := net.Dial("tcp", addr)
				if err != nil {
					c.Close()
					return
				}
				track(c, true)
				track(d, true)
				defer func() {
					c.Close()
					d.Close()
					track(c, false)
					track(d, false)
				}()
				done := make(chan struct{})
				go func() { _, _ = io.Copy(d, c); _ = d.(*net.TCPConn).CloseWrite(); close(done) }()
				_, _ = io.Copy(c, d)
				_ = c.(*net.TCPConn).CloseWrite()
				<-done
			})
		}
	})
	return l.Addr().String()
}
