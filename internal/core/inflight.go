package core

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/sbinit"
)

// A connection from the daemon to a sandbox's init is a socket whose
// peer is outside the sandbox: CRIU cannot dump init while one is open.
// The Manager counts them per sandbox, so a full checkpoint can wait for
// short ones and refuse clearly while a command is still running.

type inflight struct {
	mu sync.Mutex
	n  map[string]int // +checklocks:mu
}

func (f *inflight) add(id string, d int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[string]int{}
	}
	f.n[id] += d
	if f.n[id] == 0 {
		delete(f.n, id)
	}
}

func (f *inflight) count(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n[id]
}

// call sends one request to the sandbox's init, counted.
func (m *Manager) call(ctx context.Context, rec sandboxRec, req sbinit.Request) (sbinit.Response, error) {
	m.inflight.add(rec.ID, 1)
	defer m.inflight.add(rec.ID, -1)
	return rec.Init.Call(ctx, req)
}

// countedConn decrements the count of its sandbox when closed.
type countedConn struct {
	net.Conn
	once sync.Once
	done func()
}

func (c *countedConn) Close() error {
	c.once.Do(c.done)
	return c.Conn.Close()
}

// dial opens a counted connection to the sandbox's init.
func (m *Manager) dial(ctx context.Context, rec sandboxRec) (net.Conn, error) {
	m.inflight.add(rec.ID, 1)
	c, err := rec.Init.Dial(ctx)
	if err != nil {
		m.inflight.add(rec.ID, -1)
		return nil, err
	}
	return &countedConn{Conn: c, done: func() { m.inflight.add(rec.ID, -1) }}, nil
}

// quiet waits up to limit for the sandbox's daemon connections to end.
func (m *Manager) quiet(id string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		n := m.inflight.count(id)
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d command(s) still running through molt exec or a session: a full checkpoint captures the sandbox between commands (detach long-running ones with --detach): %w", n, errdefs.ErrFailedPrecondition)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
