package sbinit

import "testing"

func TestFindMarker(t *testing.T) {
	const n = "molt0011"
	cases := []struct {
		in         string
		start, end int
		rc         string
	}{
		{"out\n\x1emolt0011 0\x1e", 4, 16, "0"},
		{"no newline\x1emolt0011 127\x1etrailing", 10, 24, "127"},
		{"\x1emolt0011\x1e", 0, 10, ""},
		{"partial \x1emolt0011 1", -1, 0, ""},
		{"other \x1emolt9999 0\x1e", -1, 0, ""},
	}
	for _, c := range cases {
		s, e, rc := findMarker([]byte(c.in), n)
		if s != c.start || (s >= 0 && (e != c.end || rc != c.rc)) {
			t.Errorf("findMarker(%q) = %d, %d, %q; want %d, %d, %q", c.in, s, e, rc, c.start, c.end, c.rc)
		}
	}
}
