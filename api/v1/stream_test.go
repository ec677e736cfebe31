package v1

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	fw := NewFrameWriter(&buf)
	big := strings.Repeat("x", 200<<10)
	if _, err := (StreamWriter{FW: fw, Type: FrameStdout}).Write([]byte(big)); err != nil {
		t.Fatal(err)
	}
	if err := fw.WriteFrame(FrameStdinClose, nil); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	for {
		typ, p, err := ReadFrame(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if typ == FrameStdinClose {
			if len(p) != 0 {
				t.Fatalf("close frame payload %q", p)
			}
			break
		}
		if typ != FrameStdout || len(p) > 64<<10 {
			t.Fatalf("frame %q of %d bytes", typ, len(p))
		}
		got.Write(p)
	}
	if got.String() != big {
		t.Fatal("payload changed in transit")
	}
	if _, _, err := ReadFrame(&buf); !errors.Is(err, io.EOF) {
		t.Fatalf("end of stream: %v", err)
	}
}

func TestFrameLimitsAndTruncation(t *testing.T) {
	var hdr [5]byte
	hdr[0] = FrameStdout
	binary.BigEndian.PutUint32(hdr[1:], MaxFrame+1)
	if _, _, err := ReadFrame(bytes.NewReader(hdr[:])); err == nil {
		t.Fatal("oversized frame accepted")
	}
	binary.BigEndian.PutUint32(hdr[1:], 10)
	if _, _, err := ReadFrame(bytes.NewReader(append(hdr[:], "short"...))); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated frame: %v", err)
	}
	if err := NewFrameWriter(io.Discard).WriteFrame(FrameStdout, make([]byte, MaxFrame+1)); err == nil {
		t.Fatal("oversized frame written")
	}
}
