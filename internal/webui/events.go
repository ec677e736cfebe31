package webui

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/meta"
)

// Source is what /events polls for changes (core.Manager in production).
type Source interface {
	Sandboxes() ([]meta.Sandbox, error)
	Checkpoints(ref string) ([]meta.Checkpoint, error)
	Turns(ref string) ([]meta.TurnRecord, error)
	Effects(ctx context.Context, ref, since string) ([]ledger.Record, map[string]bool, error)
}

// Change is the data of an /events "change" event: what the page should
// fetch again.
type Change struct {
	// List is set when the sandbox list changed (one created, removed,
	// or its state, head or name changed).
	List bool `json:"list,omitempty"`
	// Sandboxes lists those whose checkpoints, turns or effects changed.
	Sandboxes []string `json:"sandboxes,omitempty"`
	// All is set when changes were lost (a slow page): fetch everything.
	All bool `json:"all,omitempty"`
}

// hub polls the source while a page listens and tells each page what
// changed. There is no event bus in the engine: polling the metadata
// database every Interval is cheap next to any operation it reports.
type hub struct {
	src      Source
	interval time.Duration
	log      *slog.Logger
	done     <-chan struct{} // the server stops: pages are let go

	mu   sync.Mutex
	subs map[chan Change]struct{} // +checklocks:mu
}

func newHub(src Source, interval time.Duration, log *slog.Logger, done <-chan struct{}) *hub {
	return &hub{src: src, interval: interval, log: log, done: done, subs: map[chan Change]struct{}{}}
}

// state is one poll's fingerprints: of the list, and of each sandbox's
// checkpoints, turns and effects.
type state struct {
	list uint64
	sbs  map[string]uint64
}

func (h *hub) listeners() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

func (h *hub) run(ctx context.Context) {
	t := time.NewTicker(h.interval)
	defer t.Stop()
	var last *state
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if h.listeners() == 0 {
			last = nil
			continue
		}
		cur, err := h.poll(ctx)
		if err != nil {
			h.log.Debug("web view: poll", "err", err)
			continue
		}
		if last == nil {
			// A first page: it may have read before this poll, so
			// whatever changed in between it fetches again.
			h.broadcast(Change{All: true})
		} else if c := diff(last, cur); c.List || len(c.Sandboxes) > 0 {
			h.broadcast(c)
		}
		last = cur
	}
}

func (h *hub) poll(ctx context.Context) (*state, error) {
	l, err := h.src.Sandboxes()
	if err != nil {
		return nil, err
	}
	st := &state{sbs: map[string]uint64{}}
	lh := fnv.New64a()
	for _, sb := range l {
		fmt.Fprintf(lh, "%s\x00%s\x00%s\x00%s\x00%s\x00%s\n", sb.ID, sb.Name, sb.State, sb.Reason, sb.Head, sb.Standby)
		sh := fnv.New64a()
		if cks, err := h.src.Checkpoints(sb.ID); err == nil {
			_ = json.NewEncoder(sh).Encode(cks)
		}
		if ts, err := h.src.Turns(sb.ID); err == nil && len(ts) > 0 {
			fmt.Fprintf(sh, "turns %d %d %s\n", len(ts), ts[len(ts)-1].Turn, ts[len(ts)-1].Decision)
		}
		if effs, orphans, err := h.src.Effects(ctx, sb.ID, ""); err == nil {
			for _, e := range effs {
				fmt.Fprintf(sh, "%s %s %v\n", e.ID, e.State, orphans[e.ID])
			}
		}
		st.sbs[sb.ID] = sh.Sum64()
	}
	st.list = lh.Sum64()
	return st, nil
}

func diff(a, b *state) Change {
	c := Change{List: a.list != b.list}
	for id, f := range b.sbs {
		if old, ok := a.sbs[id]; !ok || old != f {
			c.Sandboxes = append(c.Sandboxes, id)
		}
	}
	slices.Sort(c.Sandboxes)
	return c
}

func (h *hub) broadcast(c Change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		select {
		case ch <- c:
		default:
			// A slow page: replace what waits with "fetch everything".
			select {
			case <-ch:
			default:
			}
			ch <- Change{All: true}
		}
	}
}

// serve streams change events to a page until it goes.
func (h *hub) serve(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	ch := make(chan Change, 1)
	h.mu.Lock()
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.subs, ch)
		h.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 2000\nevent: hello\ndata: {}\n\n")
	fl.Flush()
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-h.done:
			return
		case <-keep.C:
			fmt.Fprint(w, ": keep-alive\n\n")
		case c := <-ch:
			b, _ := json.Marshal(c)
			fmt.Fprintf(w, "event: change\ndata: %s\n\n", b)
		}
		fl.Flush()
	}
}
