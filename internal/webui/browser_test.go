package webui

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/coord"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/httpapi"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sbinit"
	"github.com/molt-sh/molt/internal/testutil"
)

func TestMain(m *testing.M) {
	sbinit.RunIfInit() // the sandboxes' init is this test binary
	os.Exit(m.Run())
}

// artifacts is where the browser test saves its screenshots: a path the
// test run leaves behind ($MOLT_ARTIFACTS, else /tmp/molt-artifacts).
func artifacts(t *testing.T) string {
	dir := os.Getenv("MOLT_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "molt-artifacts")
	}
	dir = filepath.Join(dir, "webui")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// tree makes a sandbox with a branching checkpoint tree, some of it
// turns: base → deps → a1 → a2, deps → b1 → b2, base → c1. It returns
// the sandbox's ID and its checkpoints' IDs by label.
func tree(t *testing.T, ctx context.Context, m *core.Manager) (string, map[string]string) {
	sb, err := m.Create(ctx, v1.SandboxCreateRequest{Name: "agent", Image: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	step := func(label string, turn bool) {
		t.Helper()
		if _, err := m.SessionRun(ctx, sb.ID, "s", v1.SessionRunRequest{Command: "head -c 200000 /dev/urandom > /root/" + label}); err != nil {
			t.Fatal(err)
		}
		if turn {
			res, err := m.EndTurn(ctx, sb.ID, v1.TurnRequest{Label: label})
			if err != nil || res.Checkpoint == nil {
				t.Fatalf("turn %s: %+v %v", label, res, err)
			}
			ids[label] = *res.Checkpoint
			return
		}
		ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS, Label: label})
		if err != nil {
			t.Fatalf("checkpoint %s: %v", label, err)
		}
		ids[label] = ck.ID
	}
	back := func(label string) {
		t.Helper()
		if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ids[label]}); err != nil {
			t.Fatalf("rollback %s: %v", label, err)
		}
	}
	effect := func(method, url string, status int) {
		t.Helper()
		if _, err := m.DeclareEffect(ctx, sb.ID, v1.EffectDeclareRequest{Method: method, URL: url, Status: status}); err != nil {
			t.Fatal(err)
		}
	}
	step("base", false)
	step("deps", false)
	effect("POST", "https://api.example/issues", 201)
	step("a1", true)
	step("a2", true)
	back("deps")
	effect("PUT", "https://api.example/issues/7/labels", 200)
	step("b1", true)
	step("b2", false)
	back("base")
	step("c1", false)
	return sb.ID, ids
}

// searchTree makes a sandbox whose checkpoints are a search tree of n
// nodes: every fifth step goes back to an earlier node and branches.
func searchTree(t *testing.T, ctx context.Context, m *core.Manager, n int) (string, []string) {
	sb, err := m.Create(ctx, v1.SandboxCreateRequest{Name: "search", Image: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range n {
		ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS, Label: fmt.Sprintf("step-%03d", i)})
		if err != nil {
			t.Fatalf("checkpoint %d: %v", i, err)
		}
		ids = append(ids, ck.ID)
		if i%5 == 4 {
			if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ids[i*2/3]}); err != nil {
				t.Fatalf("rollback: %v", err)
			}
		}
	}
	return sb.ID, ids
}

// TestBrowser serves the web view of a real engine, opens it in headless
// Chromium, checks the tree's nodes, rolls back through the page's
// confirmation and checks the engine's head moved; a checkpoint taken
// meanwhile must appear by itself (server-sent events).
func TestBrowser(t *testing.T) {
	testutil.RequireRoot(t)
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		testutil.Unavailable(t, "chromium is not installed (scripts/deps.sh installs it)")
	}
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	m, err := core.Open(ctx, core.Config{Root: t.TempDir(), PoolSize: 8 << 30, CacheDir: os.Getenv("MOLT_CACHE_DIR"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sbs, _ := m.Sandboxes()
		for _, s := range sbs {
			if err := m.Remove(ctx, s.ID); err != nil {
				t.Errorf("remove %s: %v", s.ID, err)
			}
		}
		m.Close()
		if err := m.Pool().Unmount(); err != nil {
			t.Errorf("unmount pool: %v", err)
		}
	})
	if _, err := m.BuildImage(ctx, v1.ImageBuildRequest{Name: "debian"}, nil); err != nil {
		t.Fatal(err)
	}
	sbID, ids := tree(t, ctx, m)
	start := time.Now()
	searchID, searchIDs := searchTree(t, ctx, m, 150)
	t.Logf("search tree of %d checkpoints made in %v", len(searchIDs), time.Since(start).Round(time.Millisecond))
	co := coord.New(m, log)
	defer co.Close()
	tokenFile := filepath.Join(t.TempDir(), "ui-url")
	s, err := Start(Config{Addr: "127.0.0.1:0", TokenFile: tokenFile, API: httpapi.Handler(m, co, log), Source: m, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if fi, err := os.Stat(tokenFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi, err)
	}
	refusals(t, s, sbID, ids["base"])

	out := artifacts(t)
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]), chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.Headless, chromedp.DisableGPU, chromedp.WindowSize(1440, 900), chromedp.UserDataDir(t.TempDir()))
	actx, cancel := chromedp.NewExecAllocator(ctx, opts...)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	bctx, cancel = context.WithTimeout(bctx, 3*time.Minute)
	defer cancel()
	node := func(label string) chromedp.CSS {
		return chromedp.CSS(fmt.Sprintf(`svg.tree .node[data-id=%q]`, ids[label]))
	}
	shot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			png, err := chromedp.CaptureScreenshot()(ctx, tg)
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(out, name), png, 0o644)
		})
	}
	if err := chromedp.Do(bctx,
		chromedp.Navigate(s.URL()),
		chromedp.WaitVisible(node("c1")),
		chromedp.WaitVisible(chromedp.CSS(`#live.on`)),
	); err != nil {
		t.Fatal(err)
	}
	if href, err := chromedp.Run(bctx, chromedp.Evaluate[string](`location.href`)); err != nil || href != "http://"+s.Addr()+"/" {
		t.Errorf("address bar %q (%v): the token must leave it", href, err)
	}
	shown, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("svg.tree .node")].map(n => n.dataset.id + " " + n.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	for label, id := range ids {
		if !slices.ContainsFunc(shown, func(s string) bool { return strings.HasPrefix(s, id+" ") && strings.Contains(s, label) }) {
			t.Errorf("checkpoint %s (%s) not in the tree: %q", label, id, shown)
		}
	}
	if len(shown) != len(ids) {
		t.Errorf("tree has %d nodes, want %d", len(shown), len(ids))
	}
	ledger, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#effects tbody tr")].map(r => r.textContent)`))
	if err != nil || len(ledger) != 2 || !strings.Contains(ledger[0], "issues/7/labels") || !strings.Contains(ledger[1], "api.example/issues") {
		t.Errorf("effect ledger shown: %q %v, want the 2 effects, newest first", ledger, err)
	}
	if err := chromedp.Do(bctx,
		chromedp.WaitVisible(node("c1")+".head"),
		chromedp.Click(node("a1")),
		chromedp.WaitVisible(chromedp.CSS(`#act-rollback`)),
		shot("webui.png"),
		chromedp.Click(chromedp.CSS(`#act-rollback`)),
		chromedp.WaitVisible(chromedp.CSS(`#modal-ok`)),
		shot("webui-confirm.png"),
		chromedp.Click(chromedp.CSS(`#modal-ok`)),
	); err != nil {
		t.Fatal(err)
	}
	waitHead(t, m, sbID, ids["a1"])
	if err := chromedp.Do(bctx, chromedp.WaitVisible(node("a1")+".head"), shot("webui-rolled-back.png")); err != nil {
		t.Fatalf("the page does not show the new head: %v", err)
	}
	forkDelete(t, bctx, m, node("c1"), shot)
	searchView(t, bctx, searchID, searchIDs, shot)
	// Back to the agent: a checkpoint taken elsewhere shows up by itself.
	if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`nav .sb[data-id=%q]`, sbID))), chromedp.WaitVisible(node("a1")+".head")); err != nil {
		t.Fatal(err)
	}
	ck, err := m.Checkpoint(ctx, sbID, v1.CheckpointRequest{Kind: v1.KindFS, Label: "live"})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(bctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(wctx, chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`svg.tree .node.head[data-id=%q]`, ck.ID))), shot("webui-live.png")); err != nil {
		t.Fatalf("the page did not show checkpoint live by itself: %v", err)
	}
}

// forkDelete forks checkpoint node through the page, then deletes the
// new sandbox through the page, each confirmed, each checked in m.
func forkDelete(t *testing.T, bctx context.Context, m *core.Manager, node chromedp.CSS, shot func(string) chromedp.Action[chromedp.Void]) {
	t.Helper()
	before, _ := m.Sandboxes()
	if err := chromedp.Do(bctx,
		chromedp.Click(node),
		chromedp.Click(chromedp.CSS(`#act-fork`)),
		chromedp.WaitVisible(chromedp.CSS(`#modal-ok`)),
		chromedp.Click(chromedp.CSS(`#modal-ok`)),
		chromedp.WaitReady(chromedp.CSS(fmt.Sprintf(`nav .sb:nth-child(%d)`, len(before)+1))),
	); err != nil {
		t.Fatalf("fork through the page: %v", err)
	}
	after, _ := m.Sandboxes()
	var forked string
	for _, sb := range after {
		if !slices.ContainsFunc(before, func(b meta.Sandbox) bool { return b.ID == sb.ID }) {
			forked = sb.ID
		}
	}
	if len(after) != len(before)+1 || forked == "" {
		t.Fatalf("sandboxes after the page's fork: %d, want %d", len(after), len(before)+1)
	}
	// The delete button of the fork's own bar: until the fork's detail
	// is drawn, the page still shows the sandbox selected before, with
	// a delete button of its own.
	del := chromedp.CSS(fmt.Sprintf(`.bar[data-sandbox=%q] #act-delete`, forked))
	if err := chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`nav .sb[data-id=%q]`, forked))),
		chromedp.WaitVisible(del),
		chromedp.Click(del),
		chromedp.WaitVisible(chromedp.CSS(`#modal-ok`)),
		shot("webui-delete.png"),
		chromedp.Click(chromedp.CSS(`#modal-ok`)),
		chromedp.WaitNotPresent(chromedp.CSS(fmt.Sprintf(`nav .sb[data-id=%q]`, forked))),
	); err != nil {
		t.Fatalf("delete through the page: %v", err)
	}
	if _, err := m.Sandbox(context.Background(), forked); err == nil {
		t.Errorf("sandbox %s still there after the page deleted it", forked)
	}
}

// searchView opens the search tree and checks that its nodes are all
// drawn, one row each, in few columns (a chain stays in its column).
func searchView(t *testing.T, bctx context.Context, sb string, ids []string, shot func(string) chromedp.Action[chromedp.Void]) {
	t.Helper()
	last := chromedp.CSS(fmt.Sprintf(`svg.tree .node[data-id=%q]`, ids[len(ids)-1]))
	if err := chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`nav .sb[data-id=%q]`, sb))),
		chromedp.WaitReady(last),
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`svg.tree .node[data-id=%q]`, ids[len(ids)/2]))),
		shot("webui-search.png"),
	); err != nil {
		t.Fatal(err)
	}
	type geo struct {
		Nodes, Rows, Columns int
		Height               float64
	}
	g, err := chromedp.Run(bctx, chromedp.Evaluate[geo](`(() => {
		const cs = [...document.querySelectorAll("svg.tree .node circle")];
		return { nodes: document.querySelectorAll("svg.tree .node").length,
			rows: new Set(cs.map(c => c.getAttribute("cy"))).size,
			columns: new Set(cs.map(c => c.getAttribute("cx"))).size,
			height: document.querySelector("svg.tree").height.baseVal.value };
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("search tree drawn: %+v", g)
	if g.Nodes != len(ids) || g.Rows != len(ids) || g.Columns > len(ids)/5 || g.Height > float64(len(ids)*22+4) {
		t.Errorf("search tree of %d nodes drawn as %+v: want a row each, in at most %d columns", len(ids), g, len(ids)/5)
	}
}

func waitHead(t *testing.T, m *core.Manager, sb, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := m.Sandbox(context.Background(), sb)
		if err == nil && got.Head == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("head %s after the page's rollback, want %s (%v)", got.Head, want, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// refusals checks that the API is not reachable without the token, nor
// changed by a cross-origin request that has it.
func refusals(t *testing.T, s *Server, sb, ck string) {
	t.Helper()
	base := "http://" + s.Addr()
	resp, err := http.Get(base + "/api/v1/sandboxes")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", resp.StatusCode)
	}
	req, _ := http.NewRequest("POST", base+"/api/v1/sandboxes/"+sb+"/rollback", strings.NewReader(`{"checkpoint":"`+ck+`"}`))
	req.Header.Set(Header, s.token)
	req.Header.Set("Origin", "http://attacker.example")
	req.Header.Set("Content-Type", "text/plain")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin POST: %d, want 403", resp.StatusCode)
	}
}
