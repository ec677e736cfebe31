package llmproxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"sync/atomic"
	"testing"
)

// replayHooks answers from a record the calls whose body hashes to
// known.
type replayHooks struct {
	*testHooks
	known string
	asked atomic.Int32
}

func (h *replayHooks) Replay(_ context.Context, c *Call) *Reply {
	h.asked.Add(1)
	if c.RequestSHA256 != h.known {
		return nil
	}
	return &Reply{Status: 200, ContentType: "text/event-stream", Body: []byte("data: recorded\n\n"), Header: http.Header{"Molt-Replayed": {"turn 3"}}}
}

// A call the Replayer knows is answered from the record: not forwarded,
// no turn ended, recorded as replayed; another goes upstream as usual.
// Every call carries its body's hash and the upstream's Content-Type.
func TestReplayer(t *testing.T) {
	var upstreamCalls atomic.Int32
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		upstreamCalls.Add(1)
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Write([]byte(`{"live":true}`))
	})
	recorded := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	sum := sha256.Sum256([]byte(recorded))
	h := &replayHooks{testHooks: newHooks(), known: hex.EncodeToString(sum[:])}
	base := start(t, Config{Upstream: mustURL(t, up.URL+"/v1"), Hooks: h})

	resp := post(t, context.Background(), base+"/v1/chat/completions", recorded, nil)
	if body := readAll(t, resp); resp.StatusCode != 200 || body != "data: recorded\n\n" ||
		resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("Molt-Replayed") != "turn 3" {
		t.Fatalf("replayed call: %s %q %v", resp.Status, body, resp.Header)
	}
	c := h.next(t)
	if !c.Replayed || c.RequestSHA256 != h.known || c.RequestBytes != len(recorded) || string(c.Response) != "data: recorded\n\n" {
		t.Fatalf("replayed call recorded as %+v", c)
	}
	if upstreamCalls.Load() != 0 || h.turnCount() != 0 {
		t.Fatalf("a replayed call reached the upstream (%d) or ended a turn (%d)", upstreamCalls.Load(), h.turnCount())
	}

	live := `{"model":"m","messages":[{"role":"user","content":"other"}]}`
	resp = post(t, context.Background(), base+"/v1/chat/completions", live, nil)
	if body := readAll(t, resp); body != `{"live":true}` {
		t.Fatalf("live call: %q", body)
	}
	c = h.next(t)
	if c.Replayed || c.ContentType != "application/json; charset=utf-8" || c.RequestSHA256 == h.known || c.RequestSHA256 == "" {
		t.Fatalf("live call recorded as %+v", c)
	}
	if upstreamCalls.Load() != 1 || h.turnCount() != 1 || h.asked.Load() != 2 {
		t.Fatalf("upstream %d, turns %d, replayer asked %d; want 1, 1, 2", upstreamCalls.Load(), h.turnCount(), h.asked.Load())
	}
}
