package main

import (
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
)

func TestParseResources(t *testing.T) {
	for _, tc := range []struct {
		mem, pids, cpus string
		io              int64
		want            v1.Resources
		bad             bool
	}{
		{want: v1.Resources{}},
		{mem: "2G", pids: "512", cpus: "1.5", io: 200, want: v1.Resources{MemoryBytes: 2 << 30, Pids: 512, CPUMillis: 1500, IOWeight: 200}},
		{mem: "0", pids: "0", cpus: "0", want: v1.Resources{MemoryBytes: -1, Pids: -1, CPUMillis: -1}},
		{mem: "unlimited", pids: "none", cpus: "Unlimited", want: v1.Resources{MemoryBytes: -1, Pids: -1, CPUMillis: -1}},
		{mem: "auto", pids: "auto", cpus: "auto", want: v1.Resources{}},
		{cpus: "0.25", want: v1.Resources{CPUMillis: 250}},
		{cpus: "0.001", bad: true},
		{cpus: "-1", bad: true},
		{cpus: "NaN", bad: true},
		{pids: "-3", bad: true},
		{mem: "lots", bad: true},
		{io: 10001, bad: true},
	} {
		got, err := parseResources(tc.mem, tc.pids, tc.cpus, tc.io)
		if tc.bad {
			if err == nil {
				t.Errorf("%+v: accepted as %+v", tc, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%+v: %+v, %v", tc, got, err)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("%+v: the API refuses %+v: %v", tc, got, err)
		}
	}
}
