package netlab

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/ns"
	"github.com/molt-sh/molt/internal/testutil"
)

func startLab(t *testing.T) *Lab {
	t.Helper()
	testutil.RequireRoot(t)
	l, err := Start(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// inLab runs fn on a thread joined into the lab's namespace.
func inLab(t *testing.T, l *Lab, fn func() error) {
	t.Helper()
	f, err := os.Open(l.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := ns.Do(f, unix.CLONE_NEWNET, fn); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %s %s", url, resp.Status, b)
	}
	return string(b)
}

func TestLab(t *testing.T) {
	l := startLab(t)
	if fi, err := os.Stat(l.Path); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("%s: %v %v", l.Path, fi, err)
	}

	// A raw request from a thread in the lab, through the mounted
	// namespace: what a process there would do.
	inLab(t, l, func() error {
		c, err := net.DialTimeout("tcp", WebIP+":80", 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		io.WriteString(c, "GET /hello HTTP/1.0\r\nHost: web.lab.test\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		if string(b) != "hello from the lab\n" {
			t.Errorf("raw GET /hello = %q", b)
		}
		return nil
	})

	// The host's namespace has none of the lab's addresses (dialing them
	// from there would leave the machine).
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if strings.HasPrefix(a.String(), "203.0.113.") || strings.HasPrefix(a.String(), DNSIP) {
			t.Fatalf("the host's namespace has the lab's address %v", a)
		}
	}

	c := l.Client()
	if got := get(t, c, "http://"+WebName+"/hello"); got != "hello from the lab\n" {
		t.Errorf("GET /hello = %q", got)
	}
	if got := get(t, c, "https://"+FilesName+"/hello"); got != "hello from the lab\n" {
		t.Errorf("HTTPS GET files /hello = %q", got)
	}
	if got := get(t, c, "https://"+OtherName+"/hello"); got != "hello from other\n" {
		t.Errorf("HTTPS GET other /hello = %q", got)
	}
	// HTTPS with the CA from the file, the way a sandbox's tools trust it.
	pool := x509.NewCertPool()
	if pem, err := os.ReadFile(l.CAFile); err != nil || !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("CA file %s: %v", l.CAFile, err)
	}
	tc := &http.Client{Transport: &http.Transport{DialContext: l.DialContext, TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if got := get(t, tc, "https://"+WebName+"/hello"); got != "hello from the lab\n" {
		t.Errorf("HTTPS GET /hello = %q", got)
	}
	// Without the CA the certificate is refused.
	if _, err := (&http.Client{Transport: &http.Transport{DialContext: l.DialContext}}).Get("https://" + WebName + "/hello"); err == nil {
		t.Error("HTTPS without the lab's CA succeeded")
	}

	resp, err := c.Post("http://"+WebName+"/echo?a=1", "text/plain", strings.NewReader("ping"))
	if err != nil {
		t.Fatal(err)
	}
	var e Echo
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if e.Method != "POST" || e.Path != "/echo" || e.Body != "ping" || e.Query != "a=1" {
		t.Errorf("echo = %+v", e)
	}

	body := get(t, c, "http://"+WebName+"/bytes/1000000")
	if !bytes.Equal([]byte(body), Pattern(1000000)) {
		t.Errorf("/bytes/1000000: %d bytes, not the pattern", len(body))
	}
	pkg := get(t, c, "https://"+FilesName+"/pkg/"+DemoFile)
	sum := get(t, c, "https://"+FilesName+"/pkg/"+DemoFile+".sha256")
	h := sha256.Sum256([]byte(pkg))
	if want := hex.EncodeToString(h[:]) + "  " + DemoFile + "\n"; sum != want || len(pkg) < 100 {
		t.Errorf("package %d bytes, sha256 file %q, want %q", len(pkg), sum, want)
	}
}

func TestLabPayments(t *testing.T) {
	l := startLab(t)
	c := l.Client()
	pay := func(url, body string) Payment {
		t.Helper()
		resp, err := c.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p Payment
		if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := pay("http://"+PayName+"/pay", `{"amount":1}`); p.Payment != 1 || p.Received != `{"amount":1}` {
		t.Errorf("first payment = %+v", p)
	}
	if p := pay("https://"+PayName+"/pay", `{"amount":2}`); p.Payment != 2 {
		t.Errorf("second payment = %+v", p)
	}
	if n := l.PayCount(); n != 2 {
		t.Fatalf("PayCount = %d, want 2", n)
	}
	if got := get(t, c, "http://"+PayName+"/count"); got != `{"count":2}`+"\n" {
		t.Errorf("/count = %q", got)
	}

	arrived, release := l.HoldPayments()
	done := make(chan Payment, 1)
	go func() { done <- pay("http://"+PayName+"/pay", "held") }()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("held payment never arrived")
	}
	if n := l.PayCount(); n != 3 {
		t.Errorf("PayCount while held = %d, want 3", n)
	}
	select {
	case p := <-done:
		t.Fatalf("held payment answered before release: %+v", p)
	case <-time.After(100 * time.Millisecond):
	}
	release()
	release()
	select {
	case p := <-done:
		if p.Payment != 3 || p.Received != "held" {
			t.Errorf("held payment = %+v", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("released payment never answered")
	}
	// The hold was for one payment only.
	if p := pay("http://"+PayName+"/pay", "after"); p.Payment != 4 {
		t.Errorf("payment after the hold = %+v", p)
	}
}

func TestLabDNSAndEcho(t *testing.T) {
	l := startLab(t)
	inLab(t, l, func() error {
		for _, network := range []string{"udp", "tcp"} {
			cl := &dns.Client{Net: network, Timeout: 5 * time.Second}
			ask := func(name string, qtype uint16) *dns.Msg {
				m := new(dns.Msg)
				m.SetQuestion(dns.Fqdn(name), qtype)
				r, _, err := cl.Exchange(m, l.DNSAddr().String())
				if err != nil {
					t.Fatalf("%s %s: %v", network, name, err)
				}
				return r
			}
			r := ask(PayName, dns.TypeA)
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != PayIP {
				t.Errorf("%s A %s = %v", network, PayName, r)
			}
			r = ask(AliasName, dns.TypeA)
			if len(r.Answer) != 2 || r.Answer[0].Header().Rrtype != dns.TypeCNAME || r.Answer[1].(*dns.A).A.String() != WebIP {
				t.Errorf("%s A %s = %v", network, AliasName, r)
			}
			if r = ask(WebName, dns.TypeAAAA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
				t.Errorf("%s AAAA %s = %v", network, WebName, r)
			}
			if r = ask("nope.lab.test", dns.TypeA); r.Rcode != dns.RcodeNameError {
				t.Errorf("%s A nope.lab.test = %v", network, r)
			}
		}

		c, err := net.DialTimeout("tcp", WebIP+":7", 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		io.WriteString(c, "echo me")
		buf := make([]byte, 7)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "echo me" {
			t.Errorf("tcp echo = %q, %v", buf, err)
		}
		u, err := net.Dial("udp", WebIP+":9")
		if err != nil {
			return err
		}
		defer u.Close()
		u.Write([]byte("datagram"))
		u.SetDeadline(time.Now().Add(5 * time.Second))
		dbuf := make([]byte, 64)
		n, err := u.Read(dbuf)
		if err != nil || string(dbuf[:n]) != "datagram" {
			t.Errorf("udp echo = %q, %v", dbuf[:n], err)
		}
		return nil
	})
}

func TestLabCloseAndTwo(t *testing.T) {
	testutil.RequireRoot(t)
	a, err := Start(Options{Name: "molt-lab-test-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := Start(Options{Name: "molt-lab-test-a"}); err == nil {
		t.Error("a second lab of the same name started")
	}
	// Both answer at the same addresses, each its own counter.
	ctx := context.Background()
	for _, l := range []*Lab{a, b} {
		get(t, l.Client(), "http://"+WebName+"/hello")
	}
	if _, err := a.Client().Post("http://"+PayName+"/pay", "text/plain", nil); err != nil {
		t.Fatal(err)
	}
	if a.PayCount() != 1 || b.PayCount() != 0 {
		t.Errorf("pay counts %d and %d, want 1 and 0", a.PayCount(), b.PayCount())
	}
	// A connection open at Close is cut, not left hanging.
	conn, err := a.DialContext(ctx, "tcp", WebIP+":7")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	arrived, _ := a.HoldPayments()
	held := make(chan error, 1)
	go func() {
		resp, err := a.Client().Post("http://"+PayName+"/pay", "text/plain", nil)
		if err == nil {
			resp.Body.Close()
		}
		held <- err
	}()
	<-arrived
	dir := a.CAFile[:strings.LastIndexByte(a.CAFile, '/')]
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Error("a payment held at Close never returned")
	}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Error("echo connection still open after Close")
	}
	for _, p := range []string{a.Path, dir} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after Close: %v", p, err)
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err != nil || bytes.Contains(b, []byte(a.Path)) {
		t.Errorf("%s still mounted (%v)", a.Path, err)
	}
	// b is untouched.
	get(t, b.Client(), "https://"+WebName+"/hello")
}

// BenchmarkLabBytes is the lab's own throughput (a client inside the
// lab), the ceiling for anything measured through molt.
func BenchmarkLabBytes(b *testing.B) {
	testutil.RequireRoot(b)
	l, err := Start(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	const n = 64 << 20
	for _, scheme := range []string{"http", "https"} {
		b.Run(scheme, func(b *testing.B) {
			c := l.Client()
			b.SetBytes(n)
			for b.Loop() {
				resp, err := c.Get(scheme + "://" + WebName + "/bytes/67108864")
				if err != nil {
					b.Fatal(err)
				}
				got, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || got != n {
					b.Fatalf("%d bytes, %v", got, err)
				}
			}
		})
	}
}

func TestLabHostsAndListen(t *testing.T) {
	testutil.RequireRoot(t)
	l, err := Start(Options{Dir: t.TempDir(), Hosts: map[string]netip.Addr{"API.Example.com.": netip.MustParseAddr("203.0.113.20")}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if a, ok := l.Lookup("api.example.com"); !ok || a.String() != "203.0.113.20" {
		t.Fatalf("Lookup = %v %v", a, ok)
	}
	ln, err := l.Listen("tcp4", "203.0.113.20:8080")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "mine\n") }))
	if got := get(t, l.Client(), "http://api.example.com:8080/"); got != "mine\n" {
		t.Errorf("own server = %q", got)
	}
	// The lab's DNS answers the name, and its certificate covers it.
	inLab(t, l, func() error {
		m := new(dns.Msg)
		m.SetQuestion("api.example.com.", dns.TypeA)
		r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, l.DNSAddr().String())
		if err != nil {
			return err
		}
		if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "203.0.113.20" {
			t.Errorf("A api.example.com = %v", r)
		}
		return nil
	})
	ln2, err := l.Listen("tcp4", "203.0.113.20:443")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(tls.NewListener(ln2, l.ServerTLS()), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	if resp, err := l.Client().Get("https://api.example.com/"); err != nil {
		t.Errorf("HTTPS to an added host: %v", err)
	} else {
		resp.Body.Close()
	}
	l.Close()
	if _, err := ln.Accept(); err == nil {
		t.Error("a test listener survived Close")
	}
}

// TestLabViaVeth reaches the lab as molt's uplink does: from another
// namespace, over a veth whose lab end has an address of its own.
func TestLabViaVeth(t *testing.T) {
	l := startLab(t)
	client, err := ns.NewNet()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	inLab(t, l, func() error {
		for _, name := range []string{"all", "default"} {
			b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + name + "/rp_filter")
			if err != nil || strings.TrimSpace(string(b)) != "0" {
				t.Errorf("lab rp_filter %s = %q, %v", name, b, err)
			}
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lab0"}, PeerName: "up0"}); err != nil {
			return err
		}
		up, err := netlink.LinkByName("up0")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(up, int(client.Fd())); err != nil {
			return err
		}
		return linkUp("lab0", "10.99.0.1/30")
	})
	err = ns.Do(client, unix.CLONE_NEWNET, func() error {
		if err := linkUp("up0", "10.99.0.2/30"); err != nil {
			return err
		}
		up, _ := netlink.LinkByName("up0")
		for _, dst := range []string{"203.0.113.0/24", "198.51.100.0/24"} {
			_, ipn, _ := net.ParseCIDR(dst)
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Dst: ipn, Gw: net.ParseIP("10.99.0.1")}); err != nil {
				return err
			}
		}
		c, err := net.DialTimeout("tcp", WebIP+":80", 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		io.WriteString(c, "GET /hello HTTP/1.0\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != helloBody {
			t.Errorf("GET /hello over the veth = %q", b)
		}
		m := new(dns.Msg)
		m.SetQuestion(FilesName+".", dns.TypeA)
		r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, l.DNSAddr().String())
		if err != nil {
			return err
		}
		if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != FilesIP {
			t.Errorf("A %s over the veth = %v", FilesName, r)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// linkUp gives link addr and brings it up, in the calling thread's
// namespace.
func linkUp(link, addr string) error {
	ln, err := netlink.LinkByName(link)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(addr)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(ln, a); err != nil {
		return err
	}
	return netlink.LinkSetUp(ln)
}

// TestLabPip installs the demo package with the system's pip, run
// inside the lab against its simple index over HTTPS.
func TestLabPip(t *testing.T) {
	l := startLab(t)
	py := testutil.Python(t)
	if err := exec.Command(py, "-m", "pip", "--version").Run(); err != nil {
		testutil.Unavailable(t, "no pip for the system python3: "+err.Error())
	}
	target := t.TempDir()
	var out []byte
	inLab(t, l, func() error {
		// Started from this thread, pip is born in the lab's namespace.
		// The index is named by address: the host's resolver knows no
		// lab names.
		cmd := exec.Command(py, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check",
			"--index-url", "https://"+FilesIP+"/simple/", "--cert", l.CAFile, "--target", target, "demo")
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + target, "PIP_CONFIG_FILE=/dev/null"}
		var err error
		if out, err = cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("pip: %w\n%s", err, out)
		}
		return nil
	})
	b, err := os.ReadFile(filepath.Join(target, "demo", "__init__.py"))
	if err != nil || !strings.Contains(string(b), "hello from demo 1.0") {
		t.Fatalf("demo not installed (%v):\n%s", err, out)
	}
}

// TestLabRemovesStale: a default-named lab whose process died is
// removed by the next Start; one of a live process is not.
func TestLabRemovesStale(t *testing.T) {
	testutil.RequireRoot(t)
	dead := exec.Command("/bin/true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale, err := Start(Options{Name: fmt.Sprintf("molt-lab-%d-0000", dead.Process.Pid)})
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close()
	live, err := Start(Options{Name: fmt.Sprintf("molt-lab-%d-0001", os.Getpid())})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	l := startLab(t)
	if !strings.HasPrefix(l.Name, fmt.Sprintf("molt-lab-%d-", os.Getpid())) {
		t.Errorf("default name %s", l.Name)
	}
	if _, err := os.Stat(stale.Path); !os.IsNotExist(err) {
		t.Errorf("stale lab %s: %v", stale.Path, err)
	}
	if _, err := os.Stat(live.Path); err != nil {
		t.Errorf("live lab %s: %v", live.Path, err)
	}
	if err := stale.Close(); err != nil {
		t.Errorf("Close of a lab removed under it: %v", err)
	}
}
