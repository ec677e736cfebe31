package egress

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// clientHello returns the bytes crypto/tls sends first as a client of
// serverName.
func helloBytes(t testing.TB, serverName string) []byte {
	t.Helper()
	a, b := net.Pipe()
	go func() {
		c := tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == "", NextProtos: []string{"h2", "http/1.1"}})
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Handshake()
		a.Close()
	}()
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	raw, _, err := readClientHello(b)
	b.Close()
	if err != nil {
		t.Fatalf("reading crypto/tls's ClientHello: %v", err)
	}
	return raw
}

// fragment re-frames a single-record ClientHello into records of at
// most n bytes of payload.
func fragment(raw []byte, n int) []byte {
	hdr, body := raw[:5], raw[5:]
	var out []byte
	for len(body) > 0 {
		k := min(n, len(body))
		out = append(out, hdr[0], hdr[1], hdr[2], byte(k>>8), byte(k))
		out = append(out, body[:k]...)
		body = body[k:]
	}
	return out
}

func TestReadClientHello(t *testing.T) {
	raw := helloBytes(t, "API.Example.com")
	for name, in := range map[string][]byte{"one record": raw, "fragmented": fragment(raw, 7)} {
		got, hello, err := readClientHello(io.MultiReader(bytes.NewReader(in), bytes.NewReader([]byte("after"))))
		if err != nil || hello.SNI != "api.example.com" || !slices.Equal(hello.ALPN, []string{"h2", "http/1.1"}) {
			t.Errorf("%s: %+v, %v", name, hello, err)
		}
		if !bytes.Equal(got, in) {
			t.Errorf("%s: read %d bytes, want exactly the hello's %d", name, len(got), len(in))
		}
	}
	if _, hello, err := readClientHello(bytes.NewReader(helloBytes(t, ""))); err != nil || hello.SNI != "" {
		t.Errorf("no server name: %+v, %v", hello, err)
	}
	for name, in := range map[string][]byte{
		"http":       []byte("GET / HTTP/1.1\r\n\r\n"),
		"huge":       {0x16, 3, 1, 0xff, 0xff},
		"not hello":  {0x16, 3, 1, 0, 4, 2, 0, 0, 0},
		"truncated":  raw[:len(raw)-3],
		"big hello":  {0x16, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff},
		"bad name":   bytes.Replace(raw, []byte("API.Example.com"), []byte("api.exa\x00ple.com"), 1),
		"empty recs": {0x16, 3, 1, 0, 0},
	} {
		if _, _, err := readClientHello(bytes.NewReader(in)); err == nil {
			t.Errorf("%s: accepted", name)
		} else if name != "truncated" && !errors.Is(err, errNotTLS) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzClientHello(f *testing.F) {
	f.Add(helloBytes(f, "example.com"))
	f.Add(fragment(helloBytes(f, "a.b.c.example.org"), 50))
	f.Add(helloBytes(f, ""))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		raw, hello, err := readClientHello(bytes.NewReader(data))
		sni := hello.SNI
		if len(raw) > len(data) || !bytes.Equal(raw, data[:len(raw)]) {
			t.Fatalf("raw is not a prefix of the input")
		}
		if err == nil && sni != "" {
			if _, err := checkServerName(sni); err != nil {
				t.Fatalf("returned server name %q fails its own check", sni)
			}
		}
	})
}
