package v1

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
)

// Exec streams are framed: each frame is a one-byte type, a big-endian
// uint32 payload length, and the payload. The same framing carries an exec
// from client to daemon (after the HTTP upgrade) and from daemon to the
// sandbox's init.
const (
	FrameStdin      byte = 'i' // client -> command: stdin bytes
	FrameStdinClose byte = 'I' // client -> command: stdin EOF
	FrameSignal     byte = 's' // client -> command: payload is the signal number as decimal text
	FrameStarted    byte = 'p' // command -> client: payload is the PID inside the sandbox (decimal)
	FrameStdout     byte = 'o'
	FrameStderr     byte = 'e'
	FrameExit       byte = 'x' // command -> client: payload is JSON ExitStatus; last frame
	FrameError      byte = 'E' // either way: payload is a message; last frame
	FrameRequest    byte = 'r' // daemon -> init: payload is a JSON request
	FrameResponse   byte = 'R' // init -> daemon: payload is a JSON response
)

// MaxFrame bounds a frame's payload so a corrupt stream cannot make a
// reader allocate without limit.
const MaxFrame = 4 << 20

// UpgradeProtocol is the value of the Upgrade header of an exec request.
const UpgradeProtocol = "molt-exec/1"

// ExitStatus ends an exec stream.
type ExitStatus struct {
	ExitCode int `json:"exit_code"`
	// Signal names the signal that killed the command, if one did.
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// DurationMS is the command's run time; Replayed says a recovery's
	// fast-forward answered from the turn log and the command did not
	// run again (DurationMS is then the recorded run's).
	DurationMS float64 `json:"duration_ms,omitempty"`
	Replayed   bool    `json:"replayed,omitempty"`
}

// FrameWriter writes frames; it is safe for concurrent use.
type FrameWriter struct {
	mu sync.Mutex
	w  io.Writer // +checklocks:mu
}

// NewFrameWriter returns a FrameWriter on w.
func NewFrameWriter(w io.Writer) *FrameWriter { return &FrameWriter{w: w} }

// WriteFrame writes one frame.
func (fw *FrameWriter) WriteFrame(typ byte, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("frame of %d bytes exceeds limit %d", len(payload), MaxFrame)
	}
	var hdr [5]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if _, err := fw.w.Write(hdr[:]); err != nil {
		return err
	}
	if len(payload) == 0 {
		return nil
	}
	_, err := fw.w.Write(payload)
	return err
}

// ReadFrame reads one frame from r.
func ReadFrame(r io.Reader) (typ byte, payload []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes exceeds limit %d", n, MaxFrame)
	}
	// The buffer grows with the bytes that arrive (doubling), not with
	// the length the header claims: a peer cannot make a reader allocate
	// MaxFrame by sending five bytes.
	payload = make([]byte, min(n, frameChunk))
	for got := 0; ; {
		if _, err := io.ReadFull(r, payload[got:]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, nil, err
		}
		got = len(payload)
		if got == int(n) {
			return hdr[0], payload, nil
		}
		payload = append(payload, make([]byte, min(int(n)-got, got))...)
	}
}

// frameChunk is what a reader allocates for a frame before its bytes
// arrive.
const frameChunk = 64 << 10

// StreamWriter adapts a frame type to io.Writer (for stdout/stderr).
type StreamWriter struct {
	FW   *FrameWriter
	Type byte
}

func (s StreamWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); {
		n := min(len(p)-off, 64<<10)
		if err := s.FW.WriteFrame(s.Type, p[off:off+n]); err != nil {
			return off, err
		}
		off += n
	}
	return len(p), nil
}
