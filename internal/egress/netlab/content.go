package netlab

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// MaxBytes is the largest /bytes/<n>.
const MaxBytes = 1 << 30

// patternPeriod is prime, so a body shifted by a power of two (a lost
// or repeated buffer) does not match.
const patternPeriod = 251

// PatternByte is byte i of every /bytes/<n> body.
func PatternByte(i int64) byte { return byte(i % patternPeriod) }

// Pattern returns the first n bytes of the /bytes pattern.
func Pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = PatternByte(int64(i))
	}
	return b
}

// patternBlock is a whole number of periods, written repeatedly.
var patternBlock = Pattern(patternPeriod * 256)

func writePattern(w io.Writer, n int64) {
	for n > 0 {
		b := patternBlock[:min(n, int64(len(patternBlock)))]
		if _, err := w.Write(b); err != nil {
			return
		}
		n -= int64(len(b))
	}
}

// DemoFile is the name of the lab's package download: a small gzipped
// tar served at /pkg/DemoFile, its SHA-256 (sha256sum format) at
// /pkg/DemoFile.sha256.
const DemoFile = "demo-1.0.tar.gz"

var demo = sync.OnceValue(func() []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	files := []struct{ name, body string }{
		{"demo-1.0/README", "demo 1.0: a package from molt's test lab\n"},
		{"demo-1.0/demo.py", "def hello():\n    return \"hello from demo 1.0\"\n"},
	}
	for _, f := range files {
		tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg, Format: tar.FormatUSTAR})
		io.WriteString(tw, f.body)
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
})

// DemoPackage returns the bytes of DemoFile.
func DemoPackage() []byte { return bytes.Clone(demo()) }

// DemoSHA256 is the hex SHA-256 of DemoPackage.
func DemoSHA256() string {
	h := sha256.Sum256(demo())
	return hex.EncodeToString(h[:])
}

// DemoWheel is the wheel of the same package, installable by pip from
// the lab's simple index at /simple/ (`pip install --index-url
// https://files.lab.test/simple/ demo`).
const DemoWheel = "demo-1.0-py3-none-any.whl"

var wheel = sync.OnceValue(func() []byte {
	files := []struct{ name, body string }{
		{"demo/__init__.py", "def hello():\n    return \"hello from demo 1.0\"\n"},
		{"demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nSummary: a package from molt's test lab\n"},
		{"demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: molt-netlab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record bytes.Buffer
	for _, f := range files {
		w, _ := zw.CreateHeader(&zip.FileHeader{Name: f.name, Method: zip.Deflate, Modified: time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC)})
		io.WriteString(w, f.body)
		h := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(h[:]), len(f.body))
	}
	record.WriteString("demo-1.0.dist-info/RECORD,,\n")
	w, _ := zw.CreateHeader(&zip.FileHeader{Name: "demo-1.0.dist-info/RECORD", Method: zip.Deflate, Modified: time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC)})
	w.Write(record.Bytes())
	zw.Close()
	return buf.Bytes()
})

// simpleIndex is the PEP 503 page of package demo: the wheel, with
// its hash in the link as pip checks it. (The tarball is no sdist pip
// could build: it has no setup.py.)
func simpleIndex() string {
	wh := sha256.Sum256(wheel())
	return fmt.Sprintf("<!DOCTYPE html>\n<html><body>\n<a href=\"/pkg/%s#sha256=%s\">%[1]s</a>\n</body></html>\n",
		DemoWheel, hex.EncodeToString(wh[:]))
}

// connSet tracks open connections so Close can close them.
type connSet struct {
	mu     sync.Mutex
	m      map[net.Conn]struct{} // +checklocks:mu
	closed bool                  // +checklocks:mu
}

func newConnSet() *connSet { return &connSet{m: map[net.Conn]struct{}{}} }

func (s *connSet) add(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return false
	}
	s.m[c] = struct{}{}
	return true
}

func (s *connSet) remove(c net.Conn) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
	c.Close()
}

func (s *connSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.m {
		c.Close()
	}
}
