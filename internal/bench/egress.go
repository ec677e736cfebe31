package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/egress"
	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/egress/netlab"
	"github.com/molt-sh/molt/internal/ns"
)

// EgressConfig configures RunEgress.
type EgressConfig struct {
	// Requests is the number of latency samples per workload and method
	// (default 1000), spread over Rounds.
	Requests int
	// Bytes is the size of one throughput transfer (default 64 MiB).
	Bytes int64
	// Rounds alternate the methods (ABAB...): each latency workload
	// takes Requests/Rounds samples of each method per round, each
	// throughput workload one transfer (default 6).
	Rounds int
	// Dir is where the temporary ledger directory goes (default
	// /var/tmp): effects and opaque records are fdatasync'd there.
	Dir      string
	Progress io.Writer
}

// EgressRow is one workload measured through molt's proxy and directly.
// Latency rows have Direct and Molt (ms); throughput rows have the rates
// (MB/s, one value per round).
type EgressRow struct {
	Workload   string  `json:"workload"`
	Proto      string  `json:"proto"` // http, https, https-inspect
	Direct     *Stats  `json:"direct,omitempty"`
	Molt       *Stats  `json:"molt,omitempty"`
	AddedP50   float64 `json:"added_p50_ms,omitempty"`
	DirectRate *Rounds `json:"direct_mb_s,omitempty"`
	MoltRate   *Rounds `json:"molt_mb_s,omitempty"`
	// Target is the target this row is checked against ("" for
	// none), Met whether it holds.
	Target string `json:"target,omitempty"`
	Met    bool   `json:"met"`
}

// EgressResult is what RunEgress measured.
type EgressResult struct {
	Host     HostFacts   `json:"host"`
	LoadEnd  string      `json:"loadavg_end"`
	Date     string      `json:"date"`
	Requests int         `json:"requests"`
	Bytes    int64       `json:"bytes"`
	Rounds   int         `json:"rounds"`
	LedgerFS string      `json:"ledger_fs"`
	Rows     []EgressRow `json:"rows"`
	// Records is what the ledger holds of each sandbox at the end.
	Records map[string]int `json:"ledger_records"`
}

// Targets of issue 18.
const (
	egressAddedP50Ms   = 1.0 // HTTP p50 added latency
	egressMinRateRatio = 0.8 // throughput within 20% of direct
)

// sandbox is a fake sandbox: a network namespace with molt's veth and
// an HTTP client whose sockets are made in it.
type egressSandbox struct {
	netns *os.File
	lab   *netlab.Lab
	roots *x509.CertPool
}

// dial connects from inside the sandbox. Names are resolved from the
// lab's table, as a sandbox with a warm resolver cache would: DNS is not
// what is measured.
func (s *egressSandbox) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if _, err := netip.ParseAddr(host); err != nil {
		a, ok := s.lab.Lookup(host)
		if !ok {
			return nil, fmt.Errorf("dial %s: no host %s in the lab", addr, host)
		}
		addr = net.JoinHostPort(a.String(), port)
	}
	var c net.Conn
	err = ns.Do(s.netns, unix.CLONE_NEWNET, func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// client is an HTTP/1.1 client (as pip, requests and curl are) in the
// sandbox; keepAlive false opens a connection per request.
func (s *egressSandbox) client(keepAlive bool) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Minute,
		Transport: &http.Transport{
			DialContext:         s.dial,
			TLSClientConfig:     &tls.Config{RootCAs: s.roots},
			DisableKeepAlives:   !keepAlive,
			DisableCompression:  true,
			MaxIdleConnsPerHost: 1,
		},
	}
}

// RunEgress starts a test internet (netlab), a real ledger and molt's
// egress with three fake sandboxes: one recorded through the proxy, one
// inspecting its HTTPS, and one bypassing the proxy (NAT only, the
// baseline). Every workload runs through molt and directly in
// alternating rounds. Preconditions: root.
func RunEgress(ctx context.Context, cfg EgressConfig) (res EgressResult, err error) {
	if cfg.Requests <= 0 {
		cfg.Requests = 1000
	}
	if cfg.Bytes <= 0 {
		cfg.Bytes = 64 << 20
	}
	if cfg.Bytes > netlab.MaxBytes {
		return res, fmt.Errorf("egress bench: at most %d bytes per transfer", int64(netlab.MaxBytes))
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 6
	}
	if cfg.Dir == "" {
		cfg.Dir = "/var/tmp"
	}
	if os.Geteuid() != 0 {
		return res, errors.New("molt bench egress needs root (network namespaces, veths, nftables)")
	}
	progress := progressf(cfg.Progress)
	res = EgressResult{Host: HostFacts{CPU: cpuModel(), CPUs: runtime.NumCPU(), Hypervisor: hypervisor(), Kernel: kernel(), Load: loadAvg()},
		Date: time.Now().UTC().Format(time.RFC3339), Requests: cfg.Requests, Bytes: cfg.Bytes, Rounds: cfg.Rounds}

	lab, err := netlab.Start(netlab.Options{})
	if err != nil {
		return res, err
	}
	defer lab.Close()
	dir, err := os.MkdirTemp(cfg.Dir, "molt-bench-egress-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	res.LedgerFS = cfg.Dir + onFS(dir)
	led, err := ledger.Open(dir)
	if err != nil {
		return res, err
	}
	defer led.Close()
	_, sbs, eps, closeAll, err := egressSandboxes(lab, led)
	if err != nil {
		return res, err
	}
	defer closeAll()

	web := "http://" + netlab.WebName
	webs := "https://" + netlab.WebName
	hello := "/hello"
	big := fmt.Sprintf("/bytes/%d", cfg.Bytes)
	pairs := []egressPair{
		{"http", "recorded", "direct", web},
		{"https", "recorded", "direct", webs},
		{"https-inspect", "inspected", "direct", webs},
	}
	for _, p := range pairs {
		for _, w := range []struct {
			name      string
			keepAlive bool
		}{{"GET /hello, kept-alive connection", true}, {"GET /hello, new connection each", false}} {
			progress("egress bench: %s %s", p.proto, w.name)
			row, err := egressLatency(ctx, cfg, sbs[p.molt], sbs[p.base], w.keepAlive, func() (*http.Request, error) {
				return http.NewRequest(http.MethodGet, p.url+hello, nil)
			})
			if err != nil {
				return res, fmt.Errorf("%s %s: %w", p.proto, w.name, err)
			}
			row.Workload, row.Proto = w.name, p.proto
			if p.proto == "http" {
				row.Target = fmt.Sprintf("p50 added < %.0f ms", egressAddedP50Ms)
				row.Met = row.AddedP50 < egressAddedP50Ms
			}
			res.Rows = append(res.Rows, row)
		}
		name := fmt.Sprintf("GET /bytes/%s", human(cfg.Bytes))
		progress("egress bench: %s %s", p.proto, name)
		row, err := egressThroughput(ctx, cfg, sbs[p.molt], sbs[p.base], p.url+big)
		if err != nil {
			return res, fmt.Errorf("%s %s: %w", p.proto, name, err)
		}
		row.Workload, row.Proto = name, p.proto
		row.Target = fmt.Sprintf("within %.0f%% of direct", 100*(1-egressMinRateRatio))
		row.Met = row.MoltRate.Median >= egressMinRateRatio*row.DirectRate.Median
		res.Rows = append(res.Rows, row)
	}
	rows, err := egressEffects(ctx, cfg, sbs, pairs)
	if err != nil {
		return res, err
	}
	res.Rows = append(res.Rows, rows...)
	res.Records = map[string]int{}
	for _, ep := range eps {
		rs, err := led.List(ep.ID, "")
		if err != nil {
			return res, err
		}
		res.Records[ep.ID] = len(rs)
	}
	res.LoadEnd = loadAvg()
	return res, nil
}

// egressPair is a workload's two methods: through molt (sandbox molt)
// and direct (sandbox base).
type egressPair struct {
	proto, molt, base string
	url               string
}

// egressEffects measures a POST, an effect, through molt and directly.
func egressEffects(ctx context.Context, cfg EgressConfig, sbs map[string]*egressSandbox, pairs []egressPair) (rows []EgressRow, err error) {
	progress := progressf(cfg.Progress)
	// An effect: the ledger's record is on disk (fdatasync) before the
	// request leaves, so a POST pays a sync a GET does not.
	for _, p := range pairs {
		if p.proto == "https" {
			continue // without inspection HTTPS is recorded per connection, not per request
		}
		progress("egress bench: %s POST (an effect)", p.proto)
		n := 0
		row, err := egressLatency(ctx, cfg, sbs[p.molt], sbs[p.base], true, func() (*http.Request, error) {
			n++
			body := fmt.Sprintf(`{"order":%d,"amount":"1.00"}`, n)
			r, err := http.NewRequest(http.MethodPost, p.url+"/echo", strings.NewReader(body))
			if err == nil {
				r.Header.Set("Content-Type", "application/json")
			}
			return r, err
		})
		if err != nil {
			return nil, fmt.Errorf("%s POST: %w", p.proto, err)
		}
		row.Workload, row.Proto = "POST /echo (effect, fdatasync'd record)", p.proto
		rows = append(rows, row)
	}
	return rows, nil
}

// egressSandboxes starts molt's egress towards lab, recording in led,
// with three fake sandboxes: "direct" (bypassing the proxy, the
// baseline), "recorded" and "inspected". closeAll undoes it all, also
// after an error.
func egressSandboxes(lab *netlab.Lab, led *ledger.Ledger) (h *egress.Host, sbs map[string]*egressSandbox, eps []*egress.Endpoint, closeAll func(), err error) {
	var closers []func()
	closeAll = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	labRoots := x509.NewCertPool()
	if !labRoots.AppendCertsFromPEM(lab.CAPEM) {
		return nil, nil, nil, closeAll, errors.New("egress bench: the lab's CA does not parse")
	}
	h = egress.NewHost(egress.Config{ID: "bench", Uplink: lab.Path, DNS: []string{lab.DNSAddr().String()},
		UpstreamRoots: labRoots, Ledger: led})
	closers = append(closers, func() { h.Close() })
	ca, err := egress.NewCA("molt bench egress")
	if err != nil {
		return nil, nil, nil, closeAll, err
	}
	sbRoots := x509.NewCertPool()
	sbRoots.AddCert(ca.Certificate())
	eps = []*egress.Endpoint{
		{ID: "direct", Bypass: true},
		{ID: "recorded"},
		{ID: "inspected", Policy: egress.Policy{Inspect: true}, CA: ca},
	}
	sbs = map[string]*egressSandbox{}
	used := map[netip.Addr]bool{}
	for _, ep := range eps {
		if ep.Addr, err = h.Alloc(used); err != nil {
			return nil, nil, nil, closeAll, err
		}
		used[ep.Addr] = true
		if err := h.Add(ep); err != nil {
			return nil, nil, nil, closeAll, err
		}
		f, err := ns.NewNet()
		if err != nil {
			return nil, nil, nil, closeAll, err
		}
		closers = append(closers, func() { f.Close() })
		if err := h.ActivateNS(ep.ID, f); err != nil {
			return nil, nil, nil, closeAll, err
		}
		roots := labRoots
		if ep.Policy.Inspect {
			roots = sbRoots
		}
		sbs[ep.ID] = &egressSandbox{netns: f, lab: lab, roots: roots}
	}

	return h, sbs, eps, closeAll, nil
}

// alternate runs fn for a and b in each of rounds, a first in even
// rounds and b first in odd ones, the system settled before each.
func alternate(rounds int, a, b *http.Client, fn func(*http.Client) error) error {
	for round := range rounds {
		order := []*http.Client{a, b}
		if round%2 == 1 {
			order = []*http.Client{b, a}
		}
		for _, c := range order {
			settle()
			if err := fn(c); err != nil {
				return err
			}
		}
	}
	return nil
}

// settle lets the previous method's garbage and sockets go before the
// next is measured.
func settle() {
	runtime.GC()
	time.Sleep(100 * time.Millisecond)
}

// doRequest sends one request and reads the whole response.
func doRequest(ctx context.Context, c *http.Client, newReq func() (*http.Request, error)) (int64, error) {
	req, err := newReq()
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req.WithContext(ctx))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return n, err
	}
	if resp.StatusCode != http.StatusOK {
		return n, fmt.Errorf("status %s", resp.Status)
	}
	return n, nil
}

// egressLatency measures requests one at a time, Requests samples per
// method over the rounds, the methods' order alternating.
func egressLatency(ctx context.Context, cfg EgressConfig, moltSB, directSB *egressSandbox, keepAlive bool, newReq func() (*http.Request, error)) (EgressRow, error) {
	per := max(1, (cfg.Requests+cfg.Rounds-1)/cfg.Rounds) // at least Requests in all
	mc, dc := moltSB.client(keepAlive), directSB.client(keepAlive)
	defer mc.CloseIdleConnections()
	defer dc.CloseIdleConnections()
	var ms, ds Sample
	for _, c := range []*http.Client{mc, dc} {
		for range 20 { // connections up, the proxy's upstream pool warm
			if _, err := doRequest(ctx, c, newReq); err != nil {
				return EgressRow{}, err
			}
		}
	}
	err := alternate(cfg.Rounds, mc, dc, func(c *http.Client) error {
		for range per {
			t := time.Now()
			if _, err := doRequest(ctx, c, newReq); err != nil {
				return err
			}
			d := time.Since(t)
			if c == mc {
				ms = append(ms, d)
			} else {
				ds = append(ds, d)
			}
		}
		return nil
	})
	if err != nil {
		return EgressRow{}, err
	}
	m, d := ms.Stats(), ds.Stats()
	// µs resolution: the added latency is a fraction of a millisecond.
	added := float64(ms.Median()-ds.Median()) / float64(time.Millisecond)
	return EgressRow{Molt: &m, Direct: &d, AddedP50: added}, nil
}

// egressThroughput downloads url once per method and round, over a new
// connection each time, the methods' order alternating.
func egressThroughput(ctx context.Context, cfg EgressConfig, moltSB, directSB *egressSandbox, url string) (EgressRow, error) {
	mc, dc := moltSB.client(false), directSB.client(false)
	get := func() (*http.Request, error) { return http.NewRequest(http.MethodGet, url, nil) }
	var mr, dr []float64
	for _, c := range []*http.Client{mc, dc} { // warm-up, not counted
		if _, err := doRequest(ctx, c, get); err != nil {
			return EgressRow{}, err
		}
	}
	err := alternate(cfg.Rounds, mc, dc, func(c *http.Client) error {
		t := time.Now()
		n, err := doRequest(ctx, c, get)
		if err != nil {
			return err
		}
		if n != cfg.Bytes {
			return fmt.Errorf("got %d bytes, want %d", n, cfg.Bytes)
		}
		rate := float64(n) / 1e6 / time.Since(t).Seconds()
		if c == mc {
			mr = append(mr, rate)
		} else {
			dr = append(dr, rate)
		}
		return nil
	})
	if err != nil {
		return EgressRow{}, err
	}
	m, d := RoundsOf(mr), RoundsOf(dr)
	return EgressRow{MoltRate: &m, DirectRate: &d}, nil
}

// PrintEgress writes the result as a table, molt beside the direct path,
// with the targets checked.
func PrintEgress(w io.Writer, r EgressResult) {
	fmt.Fprintf(w, "host: %s, %d CPUs, hypervisor %s, kernel %s\n", r.Host.CPU, r.Host.CPUs, r.Host.Hypervisor, r.Host.Kernel)
	fmt.Fprintf(w, "host: load %s at the start, %s at the end; ledger in %s; %s\n\n", r.Host.Load, r.LoadEnd, r.LedgerFS, r.Date)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "proto\tworkload\tdirect (NAT)\tthrough molt\tadded / ratio\ttarget\t")
	for _, row := range r.Rows {
		target := "-"
		if row.Target != "" {
			target = row.Target + ": " + verdict(row.Met)
		}
		if row.Molt != nil {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%+.3f ms p50\t%s\t\n", row.Proto, row.Workload,
				egressLat(*row.Direct), egressLat(*row.Molt), row.AddedP50, target)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s MB/s\t%s MB/s\t%s\t%s\t\n", row.Proto, row.Workload,
			row.DirectRate.Format(0), row.MoltRate.Format(0), RatioString(row.MoltRate.Median, row.DirectRate.Median), target)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nlatency: p50 / p99 (max below 100 samples) of %d requests per method; throughput: median (min-max) of %d transfers per method, a new connection each.\n", r.Requests, r.Rounds)
	fmt.Fprintf(w, "ledger records at the end: recorded sandbox %d, inspected sandbox %d, direct sandbox %d.\n",
		r.Records["recorded"], r.Records["inspected"], r.Records["direct"])
	var buf bytes.Buffer
	for _, row := range r.Rows {
		if row.Target != "" && !row.Met {
			fmt.Fprintf(&buf, " %s %s;", row.Proto, row.Workload)
		}
	}
	if buf.Len() == 0 {
		fmt.Fprintln(w, "targets: all met")
	} else {
		fmt.Fprintf(w, "targets MISSED:%s\n", strings.TrimSuffix(buf.String(), ";"))
	}
}

// egressLat formats a p50 and the tail Stats.Tail allows, in µs-precise
// milliseconds: the differences are fractions of one.
func egressLat(s Stats) string {
	l, v := s.Tail()
	return fmt.Sprintf("%.3f / %s %.3f ms", s.P50, l, v)
}
