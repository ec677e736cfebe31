package egress

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/testutil"
)

// TestProxyOriginalDst runs the proxy behind a real nftables redirect in
// a network namespace of the test's own: a connection to
// 127.0.0.1:9999 there lands on the proxy, which reads where it was
// going with SO_ORIGINAL_DST.
func TestProxyOriginalDst(t *testing.T) {
	testutil.RequireRoot(t)
	name := fmt.Sprintf("molt-pxtest-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		testutil.Unavailable(t, fmt.Sprintf("ip netns add: %v: %s", err, out))
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	nsfd, err := unix.Open("/var/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(nsfd)

	// The world: an echo server in the test's own namespace.
	world := echoServer(t)
	led := &fakeLedger{}
	ep := &Endpoint{ID: "sb1", Addr: netip.MustParseAddr("127.0.0.1"), Policy: policy(nil)}
	p := NewProxy(ProxyConfig{
		Lookup: func(netip.Addr) (*Endpoint, bool) { return ep, true },
		Ledger: led,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, world)
		},
	})
	defer p.Close()

	type result struct {
		got string
		err error
	}
	done := make(chan result, 1)
	go func() {
		// This thread enters the namespace and ends with the goroutine
		// (it is never unlocked).
		runtime.LockOSThread()
		if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
			done <- result{err: err}
			return
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			done <- result{err: err}
			return
		}
		go p.Serve(l)
		if err := redirect(nsfd, uint16(l.Addr().(*net.TCPAddr).Port)); err != nil {
			done <- result{err: fmt.Errorf("nftables: %w", err)}
			return
		}
		c, err := net.DialTimeout("tcp", "127.0.0.1:9999", 5*time.Second)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		io.WriteString(c, "through the redirect")
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		done <- result{string(b), err}
	}()
	r := <-done
	if r.err != nil || r.got != "through the redirect" {
		t.Fatalf("got %q, %v", r.got, r.err)
	}
	rec := led.waitRecords(t, 1)[0]
	if rec.Request.Addr != "127.0.0.1:9999" || rec.Kind != ledger.Opaque || rec.Response.BytesOut != 20 {
		t.Errorf("record %+v", rec)
	}
}

// redirect adds "tcp dport 9999 redirect to :port" for locally sent
// traffic in the namespace nsfd.
func redirect(nsfd int, port uint16) error {
	c, err := nftables.New(nftables.WithNetNSFd(nsfd))
	if err != nil {
		return err
	}
	tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "molt_test"})
	ch := c.AddChain(&nftables.Chain{Name: "out", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(9999)},
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1},
	}})
	return c.Flush()
}
