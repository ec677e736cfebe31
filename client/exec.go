package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	v1 "github.com/molt-sh/molt/api/v1"
)

// ExecIO connects a command's standard streams. Nil Stdout or Stderr
// discard; a nil Stdin gives the command /dev/null.
type ExecIO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Signals, if set, forwards each received signal number to the
	// command's process group.
	Signals <-chan int
}

// Exec runs a command in a sandbox, streaming its output, and returns its
// exit status when it ends. Cancelling ctx kills the command.
func (c *Client) Exec(ctx context.Context, ref string, req v1.ExecRequest, eio ExecIO) (v1.ExitStatus, error) {
	if req.Detach {
		return v1.ExitStatus{}, errors.New("exec: use ExecDetached for detached commands")
	}
	req.Stdin = eio.Stdin != nil
	body, err := json.Marshal(req)
	if err != nil {
		return v1.ExitStatus{}, err
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return v1.ExitStatus{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	hreq, err := http.NewRequest("POST", "http://molt/v1/sandboxes/"+esc(ref)+"/exec", nil)
	if err != nil {
		return v1.ExitStatus{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Connection", "Upgrade")
	hreq.Header.Set("Upgrade", v1.UpgradeProtocol)
	c.authorize(hreq)
	hreq.ContentLength = int64(len(body))
	hreq.Body = io.NopCloser(bytes.NewReader(body))
	if err := hreq.Write(conn); err != nil {
		return v1.ExitStatus{}, fmt.Errorf("exec: %w", err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, hreq)
	if err != nil {
		return v1.ExitStatus{}, fmt.Errorf("exec: %w", ctxErr(ctx, err))
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return v1.ExitStatus{}, decodeError(resp)
	}
	fw := v1.NewFrameWriter(conn)
	if eio.Stdin != nil {
		go func() {
			_, _ = io.Copy(v1.StreamWriter{FW: fw, Type: v1.FrameStdin}, eio.Stdin)
			_ = fw.WriteFrame(v1.FrameStdinClose, nil)
		}()
	}
	if eio.Signals != nil {
		go func() {
			for {
				select {
				case n, ok := <-eio.Signals:
					if !ok {
						return
					}
					_ = fw.WriteFrame(v1.FrameSignal, []byte(strconv.Itoa(n)))
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	for {
		typ, payload, err := v1.ReadFrame(br)
		if err != nil {
			return v1.ExitStatus{}, fmt.Errorf("exec: stream ended before the command's exit status: %w", ctxErr(ctx, err))
		}
		switch typ {
		case v1.FrameStdout:
			if eio.Stdout != nil {
				_, _ = eio.Stdout.Write(payload)
			}
		case v1.FrameStderr:
			if eio.Stderr != nil {
				_, _ = eio.Stderr.Write(payload)
			}
		case v1.FrameExit:
			var st v1.ExitStatus
			if err := json.Unmarshal(payload, &st); err != nil {
				return st, fmt.Errorf("exec: decode exit status: %w", err)
			}
			return st, nil
		case v1.FrameError:
			return v1.ExitStatus{}, fmt.Errorf("exec: %s", payload)
		}
	}
}

// ExecDetached starts a command in the background and returns its PID
// inside the sandbox.
func (c *Client) ExecDetached(ctx context.Context, ref string, req v1.ExecRequest) (int, error) {
	req.Detach = true
	req.Stdin = false
	var res v1.ExecDetached
	err := c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/exec", req, &res)
	return res.Pid, err
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
