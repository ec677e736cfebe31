package bench

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func msSample(v ...float64) Sample {
	var s Sample
	for _, x := range v {
		s = append(s, time.Duration(x*float64(time.Millisecond)))
	}
	return s
}

func TestQuantileAndMedian(t *testing.T) {
	for _, c := range []struct {
		name   string
		s      Sample
		median float64
		p95    float64
	}{
		{"empty", nil, 0, 0},
		{"one sample", msSample(7), 7, 7},
		{"two samples: the mean of both", msSample(4, 2), 3, 4},
		{"odd count", msSample(5, 1, 3), 3, 5},
		{"even count", msSample(1, 2, 3, 10), 2.5, 10},
	} {
		if got := msOf(c.s.Median()); got != c.median {
			t.Errorf("%s: median %v, want %v", c.name, got, c.median)
		}
		if got := msOf(c.s.Quantile(0.95)); got != c.p95 {
			t.Errorf("%s: p95 %v, want %v", c.name, got, c.p95)
		}
	}
	// Nearest rank: the 0.5-quantile of 1..10 is 5, q=1 the max, q=0 the min.
	s := msSample(10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
	for q, want := range map[float64]float64{0: 1, 0.5: 5, 0.9: 9, 1: 10} {
		if got := msOf(s.Quantile(q)); got != want {
			t.Errorf("quantile %v of 1..10: %v, want %v", q, got, want)
		}
	}
	// The sample itself is left unsorted.
	if s[0] != 10*time.Millisecond {
		t.Errorf("Quantile sorted the sample in place")
	}
}

// TestStatsTail: a p99 is stated only with at least 100 samples; below
// that the tail is the max, labelled as such.
func TestStatsTail(t *testing.T) {
	var small Sample
	for i := 1; i <= 99; i++ {
		small = append(small, time.Duration(i)*time.Millisecond)
	}
	st := small.Stats()
	if st.N != 99 || st.P99 != 0 || st.Max != 99 || st.Min != 1 || st.P50 != 50 {
		t.Fatalf("99 samples: %+v, want no p99, min 1, max 99, p50 50", st)
	}
	if l, v := st.Tail(); l != "max" || v != 99 {
		t.Errorf("99 samples: tail %s %v, want max 99", l, v)
	}
	if got := st.TailString(); got != "max 99.0 ms" {
		t.Errorf("99 samples: %q", got)
	}
	big := append(small, 1000*time.Millisecond)
	st = big.Stats()
	if l, v := st.Tail(); l != "p99" || v != 99 {
		t.Errorf("100 samples: tail %s %v, want p99 99 (nearest rank)", l, v)
	}
	if st.Max != 1000 {
		t.Errorf("100 samples: max %v", st.Max)
	}
	one := msSample(3.5).Stats()
	if one.N != 1 || one.P50 != 3.5 || one.P95 != 3.5 || one.Max != 3.5 || one.Min != 3.5 {
		t.Errorf("one sample: %+v", one)
	}
	if got := one.TailString(); got != "max 3.5 ms" {
		t.Errorf("one sample: %q", got)
	}
	if (Sample{}).Stats() != (Stats{}) {
		t.Errorf("empty sample: %+v", (Sample{}).Stats())
	}
}

func TestRounds(t *testing.T) {
	if r := RoundsOf(nil); r.N != 0 || r.Format(1) != "-" {
		t.Errorf("no rounds: %+v %q", r, r.Format(1))
	}
	r := RoundsOf([]float64{120})
	if r.Median != 120 || r.Min != 120 || r.Max != 120 || r.Format(0) != "120 (1 round)" {
		t.Errorf("one round: %+v %q", r, r.Format(0))
	}
	r = RoundsOf([]float64{300, 100, 200})
	if r.Median != 200 || r.Min != 100 || r.Max != 300 || r.Format(0) != "200 (100-300)" {
		t.Errorf("three rounds: %+v %q", r, r.Format(0))
	}
	if !slices.Equal(r.Values, []float64{300, 100, 200}) {
		t.Errorf("values reordered: %v", r.Values)
	}
	r = RoundsOf([]float64{4, 1, 2, 3})
	if r.Median != 2.5 || r.Format(1) != "2.5 (1.0-4.0)" {
		t.Errorf("four rounds: %+v %q", r, r.Format(1))
	}
	if median([]float64{1, 2, 3, 4}) != 2.5 {
		t.Errorf("median of an even count is the mean of the middle two")
	}
}

func TestRatio(t *testing.T) {
	for _, c := range []struct {
		a, b float64
		ok   bool
		want string
	}{
		{10, 4, true, "2.50x"},
		{1, 3, true, "0.33x"},
		{0, 5, true, "0.00x"},
		{5, 0, false, "n/a"},
		{5, -1, false, "n/a"},
		{5, math.NaN(), false, "n/a"},
		{5, math.Inf(1), false, "n/a"},
		{math.NaN(), 2, false, "n/a"},
	} {
		r, ok := Ratio(c.a, c.b)
		if ok != c.ok || (ok && r != c.a/c.b) {
			t.Errorf("Ratio(%v, %v) = %v, %v", c.a, c.b, r, ok)
		}
		if got := RatioString(c.a, c.b); got != c.want {
			t.Errorf("RatioString(%v, %v) = %q, want %q", c.a, c.b, got, c.want)
		}
	}
}

func TestRotateModes(t *testing.T) {
	m := []string{ModeNone, ModeAuto, ModeFull}
	for i, want := range [][]string{{"none", "auto", "full"}, {"auto", "full", "none"}, {"full", "none", "auto"}, {"none", "auto", "full"}} {
		if got := RotateModes(m, i); !slices.Equal(got, want) {
			t.Errorf("trajectory %d: %v, want %v", i, got, want)
		}
	}
	if !slices.Equal(m, []string{"none", "auto", "full"}) {
		t.Errorf("modes changed in place: %v", m)
	}
	if RotateModes(nil, 3) != nil {
		t.Errorf("no modes")
	}
}

func TestHostParsing(t *testing.T) {
	info := []byte("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu vme hypervisor lahf_lm\n\nprocessor\t: 1\nmodel name\t: other\n")
	if got := cpuinfoField(info, "model name", "?"); got != "AMD EPYC 7B13" {
		t.Errorf("model name %q", got)
	}
	if got := cpuinfoField(info, "bogus", "?"); got != "?" {
		t.Errorf("missing field %q", got)
	}
	if got := flagsHypervisor(cpuinfoField(info, "flags", "")); got != "present (kind unknown)" {
		t.Errorf("guest flags: %q", got)
	}
	if got := flagsHypervisor("fpu vme de"); got != "none (bare metal)" {
		t.Errorf("bare metal flags: %q", got)
	}
	if got := flagsHypervisor(""); got != "unknown" {
		t.Errorf("no flags: %q", got)
	}
	if got := kmsgRecordHypervisor([]byte("6,12,0,-;Hypervisor detected: PVM\n")); got != "PVM" {
		t.Errorf("kmsg record: %q", got)
	}
	if got := kmsgRecordHypervisor([]byte("6,13,0,-;Booting paravirtualized kernel\n")); got != "" {
		t.Errorf("unrelated record: %q", got)
	}
}

// TestPrintHost: every fact is in the header, unknown ones say so.
func TestPrintHost(t *testing.T) {
	var buf bytes.Buffer
	PrintHost(&buf, HostFacts{CPU: "AMD EPYC", CPUs: 2, Hypervisor: "PVM", FaultUS: 0.734, Kernel: "6.18.0",
		PoolBacking: "btrfs on a loop file (/x/pool.img, on ext4)", PoolNodeSize: 8192, CRIU: "4.2.1", Load: "1.0 2.0 3.0"})
	out := buf.String()
	for _, want := range []string{"AMD EPYC, 2 CPUs, hypervisor PVM", "page fault 0.73 µs per 4 KiB page", "kernel 6.18.0, CRIU 4.2.1, pool btrfs on a loop file (/x/pool.img, on ext4), node size 8192"} {
		if !strings.Contains(out, want) {
			t.Errorf("header lacks %q:\n%s", want, out)
		}
	}
	buf.Reset()
	PrintHost(&buf, HostFacts{PoolBacking: "unknown", CRIU: "unknown"})
	if out := buf.String(); !strings.Contains(out, "page fault unknown") || !strings.Contains(out, "node size unknown") {
		t.Errorf("unknown facts:\n%s", out)
	}
}

// TestGatherHostMachine: the facts read from this machine are filled
// (no daemon: the pool is unknown).
func TestGatherHostMachine(t *testing.T) {
	f := GatherHost(t.Context(), nil, "")
	if f.CPU == "" || f.CPUs < 1 || f.Kernel == "" || f.Kernel == "unknown" || f.Hypervisor == "" {
		t.Errorf("facts: %+v", f)
	}
	if !(f.FaultUS > 0 && f.FaultUS < 1000) {
		t.Errorf("page fault cost %v µs", f.FaultUS)
	}
	if f.PoolBacking != "unknown" || f.CRIU != "unknown" {
		t.Errorf("without a daemon or CRIU: pool %q, CRIU %q", f.PoolBacking, f.CRIU)
	}
}

// TestResolveData: the default data is found relative to the repository
// root, from any directory inside it, and a clear error says to pass the
// flag otherwise; the real layout resolves too when the data is there.
func TestResolveData(t *testing.T) {
	top := t.TempDir()
	repo := filepath.Join(top, "molt")
	deep := filepath.Join(repo, "bin", "sub")
	data := filepath.Join(top, "shared", "data", "trajectories", "public.jsonl")
	for _, d := range []string{deep, filepath.Dir(data)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(repo, "go.mod"), []byte("module github.com/molt-sh/molt\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Not found yet: the error names the path and the flag.
	if _, err := ResolveData(DefaultTrajectories, deep); err == nil || !strings.Contains(err.Error(), "--data") || !strings.Contains(err.Error(), data) {
		t.Fatalf("missing data: %v", err)
	}
	if err := os.WriteFile(data, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, start := range []string{deep, repo, filepath.Join(repo, "bin")} {
		got, err := ResolveData(DefaultTrajectories, "", filepath.Join(top, "nowhere-else"), start)
		if err != nil || got != data {
			t.Errorf("from %s: %q, %v; want %s", start, got, err, data)
		}
	}
	// Another module's go.mod is not the root.
	other := filepath.Join(top, "other")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "go.mod"), []byte("module example.com/other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ResolveData(DefaultTrajectories, other); err == nil || !strings.Contains(err.Error(), "--data") {
		t.Errorf("outside the repository: %v", err)
	}
	// This test runs inside the repository: its root is found.
	if root, err := RepoRoot("."); err != nil || !isMoltModule(filepath.Join(root, "go.mod")) {
		t.Errorf("repository root from the package: %q, %v", root, err)
	}
}

func matches(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }
