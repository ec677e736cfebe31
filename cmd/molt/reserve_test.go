package main

import "testing"

func TestParseReserve(t *testing.T) {
	for _, c := range []struct {
		in      string
		bytes   int64
		percent float64
		bad     bool
	}{
		{in: "auto"}, {in: "1G", bytes: 1 << 30}, {in: "0", bytes: -1},
		{in: "5%", percent: 5}, {in: "0%", bad: true}, {in: "100%", bad: true},
		{in: "x%", bad: true}, {in: "-1G", bad: true},
	} {
		b, p, err := parseReserve(c.in)
		if (err != nil) != c.bad || b != c.bytes || p != c.percent {
			t.Errorf("parseReserve(%q) = %d, %v, %v", c.in, b, p, err)
		}
	}
}
