package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseCPUBusy(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	stat := "cpu  100 20 30 1000 50 5 5 40 7 1\ncpu0 1 2 3 4 5 6 7 8 9 10\n"
	if got, want := parseCPUBusy(stat), (100+20+30+5+5+40)/100.0; math.Abs(got-want) > 1e-9 {
		t.Fatalf("busy %v, want %v (idle, iowait and guest time left out)", got, want)
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 x 4 5"} {
		if got := parseCPUBusy(bad); got != 0 {
			t.Errorf("%q: %v, want 0", bad, got)
		}
	}
}

func TestCompareFleetAndProject(t *testing.T) {
	none := FleetRun{Mode: ModeNone, Sandboxes: 4, Turns: 100, AgentSeconds: 200, ExecSeconds: 50, CPUSeconds: 30, Seconds: 60}
	auto := FleetRun{Mode: ModeAuto, Sandboxes: 4, Turns: 100, AgentSeconds: 210, CPUSeconds: 40, Seconds: 62, DrainSeconds: 18,
		BytesWritten: 100 << 10, Uploaded: 200 << 10, StoreRequests: 160}
	s := compareFleet(none, auto)
	if math.Abs(s.Overhead-0.05) > 1e-9 || math.Abs(s.CPUPerTurnMS-100) > 1e-9 || s.RequestsPerTurn != 1.6 || s.StoreRPS != 2 {
		t.Fatalf("%+v", s)
	}
	if s.UploadedPerTurn != 2048 || s.WrittenPerTurn != 1024 {
		t.Fatalf("per turn: %+v", s)
	}
	res := FleetResult{Runs: []FleetRun{none, auto}, Sizes: []FleetSize{{Sandboxes: 2, CPUPerTurnMS: 999}, s}}
	// Waits of 0.5 s at scale 0.05: 10 s before scaling; commands 0.5 s.
	waits := [][]time.Duration{{500 * time.Millisecond, 500 * time.Millisecond}}
	p := project(ProjectConfig{Cores: 128, PerCore: 2, Hosts: 1000}, res, waits, 0.05)
	if p.From != 4 || math.Abs(p.TurnInterval-10.5) > 1e-9 || p.Sandboxes != 256 {
		t.Fatalf("projection from %d sandboxes, interval %v, %d sandboxes", p.From, p.TurnInterval, p.Sandboxes)
	}
	tps := 256 / 10.5
	if math.Abs(p.TurnsPerS-tps) > 1e-9 || math.Abs(p.CPUCores-tps*0.1) > 1e-9 || math.Abs(p.StoreRPS-tps*1.6) > 1e-9 {
		t.Fatalf("%+v", p)
	}
	if math.Abs(p.FleetStoreRPS-p.StoreRPS*1000) > 1e-6 {
		t.Fatalf("fleet %+v", p)
	}
	if p := project(ProjectConfig{Cores: 128, PerCore: 2, Hosts: 10, TurnInterval: 5 * time.Second}, res, nil, 0.05); p.TurnInterval != 5 || p.IntervalFrom != "given" {
		t.Fatalf("given interval: %+v", p)
	}
	var b bytes.Buffer
	PrintFleet(&b, FleetResult{Store: "s3://x", Runs: res.Runs, Sizes: []FleetSize{s}, Projection: p})
	for _, want := range []string{"s3://x", "+5.00%", "100.0 ms", "Projection from 4 sandboxes"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, b.String())
		}
	}
}
