package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/errdefs"
)

// route is one endpoint with a body its checks let through and the engine
// method it must reach.
type route struct{ method, path, body, calls string }

// routes is every endpoint whose answer comes from the engine (host and
// metrics cannot fail). calls lists the engine's methods in order.
var routes = []route{
	{"GET", "/v1/images", "", "Images"},
	{"POST", "/v1/images/build", `{"name":"img"}`, "BuildImage"},
	{"POST", "/v1/images/import", `{"name":"img","path":"/x"}`, "ImportImage"},
	{"POST", "/v1/images/pull", `{"name":"img","ref":"127.0.0.1:1/a:b"}`, "PullImage"},
	{"POST", "/v1/images/img/push", `{"ref":"127.0.0.1:1/a:b"}`, "PushImage"},
	{"POST", "/v1/sandboxes/sb/commit", `{"name":"img"}`, "CommitSandbox"},
	{"GET", "/v1/images/img", "", "Image"},
	{"DELETE", "/v1/images/img", "", "RemoveImage"},
	{"GET", "/v1/sandboxes", "", "Sandboxes"},
	{"POST", "/v1/sandboxes", `{"image":"img"}`, "Create"},
	{"GET", "/v1/sandboxes/sb", "", "Sandbox"},
	{"DELETE", "/v1/sandboxes/sb", "", "Sandbox Remove"},
	{"POST", "/v1/sandboxes/sb/stop", "", "Stop"},
	{"POST", "/v1/sandboxes/sb/start", "", "Start"},
	{"POST", "/v1/sandboxes/sb/exec", `{"args":["true"],"detach":true}`, "Exec"},
	{"POST", "/v1/sandboxes/sb/sessions/main/run", `{"command":"true"}`, "SessionRun"},
	{"DELETE", "/v1/sandboxes/sb/sessions/main", "", "SessionClose"},
	{"GET", "/v1/sandboxes/sb/checkpoints", "", "Checkpoints"},
	{"POST", "/v1/sandboxes/sb/checkpoints", `{"kind":"fs"}`, "Checkpoint"},
	{"POST", "/v1/sandboxes/sb/checkpoints", `{"kind":"auto"}`, "EndTurn"},
	{"POST", "/v1/sandboxes/sb/rollback", `{"checkpoint":"ck"}`, "RollbackWith"},
	{"POST", "/v1/sandboxes/sb/recover", `{"to":"ck"}`, "Recover"},
	{"GET", "/v1/checkpoints/ck/chain", "", "VerifyChain"},
	{"GET", "/v1/sandboxes/sb/recover", "", "Recovery"},
	{"POST", "/v1/sandboxes/sb/turn", `{}`, "EndTurn"},
	{"GET", "/v1/sandboxes/sb/turns", "", "Turns"},
	{"PUT", "/v1/sandboxes/sb/llm", `{"upstream":"http://127.0.0.1:1"}`, "LLM.Set"},
	{"GET", "/v1/sandboxes/sb/llm", "", "LLM.Get"},
	{"DELETE", "/v1/sandboxes/sb/llm", "", "Sandbox"},
	{"POST", "/v1/sandboxes/sb/fork", `{"n":2}`, "Fork"},
	{"POST", "/v1/sandboxes/sb/hibernate", "", "Hibernate"},
	{"POST", "/v1/sandboxes/sb/resume", "", "Resume"},
	{"GET", "/v1/checkpoints/ck", "", "CheckpointInfo"},
	{"DELETE", "/v1/checkpoints/ck", "", "DeleteCheckpoint"},
	{"POST", "/v1/checkpoints/ck/verify", "", "VerifyCheckpoint"},
	{"POST", "/v1/checkpoints/ck/fork", ``, "Fork"},
	{"GET", "/v1/checkpoints/ck/export", "", "ExportCheckpoint"},
	{"POST", "/v1/checkpoints/import", "", "ImportCheckpoint"},
}

// TestErrorKindStatus: every endpoint answers an engine error of each kind
// with the kind's status (docs/api.md's table, written out here) and the
// kind and message in the body; a lack of space wins over another kind;
// an error of no kind is 500 internal, a cancelled one 503.
func TestErrorKindStatus(t *testing.T) {
	srv, f := fakeServer(t)
	amb := &errdefs.AmbiguousError{Kind: "checkpoint", Ref: "l", Candidates: []string{"a:l", "b:l"}}
	for _, c := range []struct {
		err    error
		status int
		kind   string
	}{
		{errdefs.ErrNotFound, 404, "not_found"},
		{errdefs.ErrAlreadyExists, 409, "already_exists"},
		{errdefs.ErrConflict, 409, "conflict"},
		{errdefs.ErrInvalidArgument, 400, "invalid_argument"},
		{errdefs.ErrFailedPrecondition, 412, "failed_precondition"},
		{errdefs.ErrUnavailable, 503, "unavailable"},
		{errdefs.ErrNotSupported, 501, "not_supported"},
		{errdefs.ErrResourceExhausted, 507, "resource_exhausted"},
		{errors.Join(errdefs.ErrUnavailable, errdefs.ErrResourceExhausted), 507, "resource_exhausted"},
		{amb, 400, "invalid_argument"},
		{context.Canceled, 503, "unavailable"},
		{context.DeadlineExceeded, 503, "unavailable"},
		{errors.New("disk on fire"), 500, "internal"},
	} {
		f.setErr(fmt.Errorf("op x: %w", c.err))
		for _, r := range routes {
			a := call(t, srv, r.method, r.path, r.body)
			if got := strings.Join(f.called(), " "); got != r.calls {
				t.Errorf("%s %s: engine calls %q, want %q", r.method, r.path, got, r.calls)
			}
			if r.path == "/v1/images/build" || r.path == "/v1/images/pull" || r.path == "/v1/images/img/push" {
				// These answer 200 at once and end their progress
				// stream with the error.
				lines := strings.Split(strings.TrimSpace(a.body), "\n")
				var p v1.Progress
				if a.status != 200 || json.Unmarshal([]byte(lines[len(lines)-1]), &p) != nil || p.Error == nil || p.Error.Kind != c.kind {
					t.Errorf("%s %s with %v: %d %q; want a last progress line of kind %s", r.method, r.path, c.err, a.status, a.body, c.kind)
				}
				continue
			}
			if a.status != c.status || a.err.Kind != c.kind || !strings.HasPrefix(a.err.Message, "op x: ") {
				t.Errorf("%s %s with %v: %d %s; want %d %s", r.method, r.path, c.err, a.status, a.body, c.status, c.kind)
			}
			if ct := a.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s %s: Content-Type %q", r.method, r.path, ct)
			}
			if c.err == amb && !slices.Equal(a.err.Candidates, amb.Candidates) {
				t.Errorf("%s %s: candidates %q, want %q", r.method, r.path, a.err.Candidates, amb.Candidates)
			}
		}
	}
	// Host and metrics reach the engine and cannot fail.
	if a := call(t, srv, "GET", "/v1/host", ""); a.status != 200 || !strings.Contains(a.body, `"fake"`) {
		t.Errorf("GET /v1/host: %d %s", a.status, a.body)
	}
	if a := call(t, srv, "GET", "/v1/metrics", ""); a.status != 200 || a.body != "fake_metric 1\n" {
		t.Errorf("GET /v1/metrics: %d %s", a.status, a.body)
	}
}

// TestUnknownField: a body with a field its type does not have is refused
// before the engine is called, on every endpoint that takes a body.
func TestUnknownField(t *testing.T) {
	srv, f := fakeServer(t)
	for _, r := range routes {
		if r.body == "" && !strings.HasSuffix(r.path, "/fork") {
			continue
		}
		body := `{"nosuchfield":1}`
		if r.body != "" {
			body = strings.TrimSuffix(r.body, "}") + `,"nosuchfield":1}`
			body = strings.Replace(body, "{,", "{", 1)
		}
		a := call(t, srv, r.method, r.path, body)
		if a.status != 400 || a.err.Kind != "invalid_argument" || !strings.Contains(a.err.Message, `unknown field "nosuchfield"`) {
			t.Errorf("%s %s %s: %d %s; want 400 invalid_argument naming the field", r.method, r.path, body, a.status, a.body)
		}
		if c := f.called(); len(c) != 0 {
			t.Errorf("%s %s %s: the engine was called (%v)", r.method, r.path, body, c)
		}
	}
}

// countingReader offers head followed by 'x' up to left bytes in all, and
// counts what is taken.
type countingReader struct {
	head  string
	left  int64
	taken atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, io.EOF
	}
	n := copy(p, c.head)
	c.head = c.head[n:]
	for i := n; i < len(p) && int64(i) < c.left; i++ {
		p[i] = 'x'
		n = i + 1
	}
	c.left -= int64(n)
	c.taken.Add(int64(n))
	return n, nil
}

// TestBodyLimitOverTheWire: a body of 256 MiB (a JSON string that never
// ends, which a decoder reads to its end) is refused as 400
// invalid_argument without the daemon reading it: the daemon answers and
// drops the connection after MaxBody, so what the client could send is
// MaxBody plus what the sockets buffer.
func TestBodyLimitOverTheWire(t *testing.T) {
	srv, f := fakeServer(t)
	const size = 256 << 20
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := &countingReader{head: `{"image":"`, left: size}
	head := fmt.Sprintf("POST /v1/sandboxes HTTP/1.1\r\nHost: molt\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(conn, body) }()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer while sending %d of %d bytes: %v", body.taken.Load(), size, err)
	}
	b, _ := io.ReadAll(resp.Body)
	var e v1.Error
	_ = json.Unmarshal(b, &e)
	if resp.StatusCode != 400 || e.Kind != "invalid_argument" || !strings.Contains(e.Message, "too large") {
		t.Fatalf("%d %s; want 400 invalid_argument, body too large", resp.StatusCode, b)
	}
	if c := f.called(); len(c) != 0 {
		t.Errorf("the engine was called (%v)", c)
	}
	conn.Close()
	if taken := body.taken.Load(); taken > 64<<20 {
		t.Errorf("the daemon took %d MiB of a %d MiB body; its limit is %d MiB", taken>>20, size>>20, MaxBody>>20)
	} else {
		t.Logf("sent %.1f MiB of %d MiB before the daemon answered and closed", float64(taken)/(1<<20), size>>20)
	}
}

// unixServer serves the fake's API on a unix socket, as the daemon does,
// for the Go client.
func unixServer(t *testing.T) (*client.Client, *fakeEngine) {
	t.Helper()
	f := &fakeEngine{}
	sock := filepath.Join(t.TempDir(), "molt.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(Handler(f, fakeLLM{f}, nil))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return client.New(sock), f
}

// fakeInit is the init side of an exec: it reads the client's frames
// until stdin closes, then answers with the pid, what stdin said on
// stdout, a line on stderr and exit status 3. It reports the frames it
// read, and then whether its connection was closed.
func fakeInit(t *testing.T, conn net.Conn, frames chan<- string, wait bool) {
	defer close(frames)
	var stdin []byte
	for {
		typ, p, err := v1.ReadFrame(conn)
		if err != nil {
			frames <- "read: " + err.Error()
			return
		}
		frames <- string(typ) + string(p)
		if typ == v1.FrameStdin {
			stdin = append(stdin, p...)
		}
		if typ == v1.FrameStdinClose {
			break
		}
	}
	fw := v1.NewFrameWriter(conn)
	_ = fw.WriteFrame(v1.FrameStarted, []byte("42"))
	if wait {
		// The command runs until the client goes away.
		_, _, err := v1.ReadFrame(conn)
		frames <- "closed: " + strconv.FormatBool(err != nil)
		return
	}
	_ = fw.WriteFrame(v1.FrameStdout, append([]byte("out:"), stdin...))
	_ = fw.WriteFrame(v1.FrameStderr, []byte("err\n"))
	_ = fw.WriteFrame(v1.FrameExit, []byte(`{"exit_code":3}`))
	conn.Close()
}

// TestExecUpgrade: an exec upgrades the connection and relays api/v1
// frames unchanged both ways: the client's stdin and its end reach init,
// init's stdout, stderr and exit status reach the client.
func TestExecUpgrade(t *testing.T) {
	cl, f := unixServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	frames := make(chan string, 16)
	var got v1.ExecRequest
	f.exec = func(ref string, req v1.ExecRequest) (int, net.Conn, error) {
		got = req
		d, i := net.Pipe()
		go fakeInit(t, i, frames, false)
		return 0, d, nil
	}
	var stdout, stderr strings.Builder
	st, err := cl.Exec(ctx, "sb", v1.ExecRequest{Args: []string{"cat"}}, client.ExecIO{
		Stdin: strings.NewReader("hello\n"), Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		t.Fatal(err)
	}
	if st.ExitCode != 3 || stdout.String() != "out:hello\n" || stderr.String() != "err\n" {
		t.Errorf("exit %+v, stdout %q, stderr %q; want 3, out:hello, err", st, stdout.String(), stderr.String())
	}
	if !got.Stdin || !slices.Equal(got.Args, []string{"cat"}) {
		t.Errorf("the engine got %+v", got)
	}
	var seen []string
	for fr := range frames {
		seen = append(seen, fr)
	}
	if want := []string{"ihello\n", "I"}; !slices.Equal(seen, want) {
		t.Errorf("init read %q, want %q", seen, want)
	}
}

// TestExecClientGone: when the client goes away, init's connection is
// closed (which kills the command).
func TestExecClientGone(t *testing.T) {
	cl, f := unixServer(t)
	frames := make(chan string, 16)
	f.exec = func(ref string, req v1.ExecRequest) (int, net.Conn, error) {
		d, i := net.Pipe()
		go fakeInit(t, i, frames, true)
		return 0, d, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cl.Exec(ctx, "sb", v1.ExecRequest{Args: []string{"sleep", "inf"}}, client.ExecIO{Stdin: strings.NewReader("")})
		done <- err
	}()
	if fr := <-frames; fr != "I" {
		t.Fatalf("init read %q first, want the end of stdin", fr)
	}
	cancel()
	select {
	case fr := <-frames:
		if fr != "closed: true" {
			t.Errorf("init: %q", fr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("init's connection still open 30 s after the client went away")
	}
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("exec: %v, want context.Canceled", err)
	}
}

// TestExecRefusals: an exec that is neither detached nor asks for the
// upgrade is refused before the engine runs it; a detached one answers
// the pid in JSON; an engine error before the upgrade is a JSON error the
// client maps to its kind.
func TestExecRefusals(t *testing.T) {
	srv, f := fakeServer(t)
	a := call(t, srv, "POST", "/v1/sandboxes/sb/exec", `{"args":["true"]}`)
	if a.status != 400 || a.err.Kind != "invalid_argument" || !strings.Contains(a.err.Message, "Upgrade: molt-exec/1") {
		t.Errorf("exec without upgrade: %d %s", a.status, a.body)
	}
	if c := f.called(); len(c) != 0 {
		t.Errorf("exec without upgrade: the engine was called (%v)", c)
	}
	f.exec = func(ref string, req v1.ExecRequest) (int, net.Conn, error) { return 42, nil, nil }
	if a := call(t, srv, "POST", "/v1/sandboxes/sb/exec", `{"args":["true"],"detach":true}`); a.status != 200 || strings.TrimSpace(a.body) != `{"pid":42}` {
		t.Errorf("detached exec: %d %s", a.status, a.body)
	}

	cl, f2 := unixServer(t)
	f2.setErr(fmt.Errorf("exec in sb: stopped: %w", errdefs.ErrFailedPrecondition))
	_, err := cl.Exec(context.Background(), "sb", v1.ExecRequest{Args: []string{"true"}}, client.ExecIO{})
	var ae *client.APIError
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !errors.As(err, &ae) || ae.Status != 412 {
		t.Errorf("exec in a stopped sandbox: %v", err)
	}
}
