package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	v1 "github.com/molt-sh/molt/api/v1"
)

// Limit flags (molt create --memory/--pids/--cpus/--io-weight, molt daemon
// --default-*): an empty flag leaves the field 0 (the daemon's default,
// or for the daemon, molt's), "unlimited", "none" or 0 ask for no limit
// (-1 on the wire).

func unlimitedWord(s string) bool {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "unlimited", "none", "max":
		return true
	}
	return false
}

// parseMemoryLimit parses a memory limit flag: a size, or unlimited/0.
func parseMemoryLimit(flag, s string) (int64, error) {
	if s == "" || strings.EqualFold(s, "auto") {
		return 0, nil
	}
	if unlimitedWord(s) {
		return -1, nil
	}
	n, err := parseSize(s)
	if err != nil {
		return 0, fmt.Errorf("--%s: %w", flag, err)
	}
	if n == 0 {
		return -1, nil
	}
	return n, nil
}

// parseCountLimit parses a pids limit flag: a count, or unlimited/0.
func parseCountLimit(flag, s string) (int64, error) {
	if s == "" || strings.EqualFold(s, "auto") {
		return 0, nil
	}
	if unlimitedWord(s) {
		return -1, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("--%s %q: want a count, 0 or unlimited", flag, s)
	}
	if n == 0 {
		return -1, nil
	}
	return n, nil
}

// parseCPUs parses a CPU limit flag in CPUs (1.5, 0.25), or unlimited/0,
// into millicpus.
func parseCPUs(flag, s string) (int64, error) {
	if s == "" || strings.EqualFold(s, "auto") {
		return 0, nil
	}
	if unlimitedWord(s) {
		return -1, nil
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) || f > 1<<20 {
		return 0, fmt.Errorf("--%s %q: want a number of CPUs (1.5), 0 or unlimited", flag, s)
	}
	if f == 0 {
		return -1, nil
	}
	m := int64(math.Round(f * 1000))
	if m < v1.MinCPUMillis {
		return 0, fmt.Errorf("--%s %q: want at least %.2f CPUs", flag, s, float64(v1.MinCPUMillis)/1000)
	}
	return m, nil
}

// parseResources parses the limit flags into v1.Resources.
func parseResources(memory, pids, cpus string, ioWeight int64) (v1.Resources, error) {
	var r v1.Resources
	var err error
	if r.MemoryBytes, err = parseMemoryLimit("memory", memory); err != nil {
		return r, err
	}
	if r.Pids, err = parseCountLimit("pids", pids); err != nil {
		return r, err
	}
	if r.CPUMillis, err = parseCPUs("cpus", cpus); err != nil {
		return r, err
	}
	if ioWeight < 0 || ioWeight > 10000 {
		return r, fmt.Errorf("--io-weight %d: want 1-10000 (0: the kernel's default)", ioWeight)
	}
	r.IOWeight = ioWeight
	return r, nil
}

// showLimit prints a limit in force as inspect shows it.
func showLimit(v int64, unit func(int64) string) string {
	if v <= 0 {
		return "unlimited"
	}
	return unit(v)
}
