package v1

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"
)

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// A header that claims MaxFrame bytes, followed by a few, must not make
// the reader allocate MaxFrame.
func TestReadFrameHostileLength(t *testing.T) {
	hdr := []byte{FrameStdout, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(hdr[1:], MaxFrame)
	var err error
	n := allocated(func() {
		for range 16 {
			_, _, err = ReadFrame(bytes.NewReader(append(hdr, "short"...)))
		}
	})
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("ReadFrame of a cut frame: %v, want ErrUnexpectedEOF", err)
	}
	if n > 16*(2*frameChunk) {
		t.Fatalf("16 cut frames claiming %d bytes allocated %d bytes", MaxFrame, n)
	}
}

// FuzzReadFrame reads frames from arbitrary bytes: a frame read is one
// the writer writes back byte for byte, a payload is never longer than
// MaxFrame, a stream cut inside a frame is an error, and a reader never
// allocates much more than the bytes it was given.
func FuzzReadFrame(f *testing.F) {
	// Seeds: testdata/fuzz/FuzzReadFrame.
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		var back bytes.Buffer
		w := NewFrameWriter(&back)
		var alloc uint64
		for {
			start := len(data) - r.Len()
			var typ byte
			var p []byte
			var err error
			alloc += allocated(func() { typ, p, err = ReadFrame(r) })
			if err != nil {
				if errors.Is(err, io.EOF) && start != len(data) {
					t.Fatalf("io.EOF inside a frame at %d of %d", start, len(data))
				}
				if start+5 <= len(data) && binary.BigEndian.Uint32(data[start+1:]) <= MaxFrame &&
					start+5+int(binary.BigEndian.Uint32(data[start+1:])) <= len(data) {
					t.Fatalf("complete frame at %d refused: %v", start, err)
				}
				break
			}
			if len(p) > MaxFrame {
				t.Fatalf("payload of %d bytes", len(p))
			}
			if err := w.WriteFrame(typ, p); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.HasPrefix(data, back.Bytes()) {
			t.Fatalf("frames written back differ from those read")
		}
		// Twice what arrived, plus one first chunk per frame call and
		// some slack for the runtime's own allocations.
		if limit := uint64(2*len(data)) + 2*frameChunk + 64<<10; alloc > limit {
			t.Fatalf("%d input bytes made the reader allocate %d", len(data), alloc)
		}
	})
}

// FuzzValidEnv: what ValidEnv accepts can be passed to execve as
// KEY=VALUE and read back as the same variable.
func FuzzValidEnv(f *testing.F) {
	// Seeds: testdata/fuzz/FuzzValidEnv.
	f.Fuzz(func(t *testing.T, k, v string) {
		err := ValidEnv(map[string]string{k: v})
		entry := k + "=" + v
		key, val, _ := bytes.Cut([]byte(entry), []byte("="))
		same := string(key) == k && string(val) == v && bytes.IndexByte([]byte(entry), 0) < 0 && k != ""
		if (err == nil) != same {
			t.Fatalf("ValidEnv(%q=%q) = %v, but the entry %q reads back as %q=%q", k, v, err, entry, key, val)
		}
	})
}

func TestResourcesValidate(t *testing.T) {
	for _, r := range []Resources{{}, {MemoryBytes: -1, Pids: -1, CPUMillis: -1}, {MemoryBytes: 1 << 30, Pids: 10, CPUMillis: 10, IOWeight: 10000}} {
		if err := r.Validate(); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
	for _, r := range []Resources{{MemoryBytes: -2}, {Pids: -5}, {CPUMillis: 5}, {IOWeight: -1}, {IOWeight: 10001}, {MemoryBytes: 4096}, {StandbyBudgetBytes: -2}} {
		if err := r.Validate(); err == nil {
			t.Errorf("%+v accepted", r)
		}
	}
}
