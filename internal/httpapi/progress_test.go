package httpapi

import (
	"bufio"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
)

// post sends a POST with accept as its Accept header.
func post(t *testing.T, url, accept string) *http.Response {
	t.Helper()
	return postBody(t, url, accept, "{}")
}

func postBody(t *testing.T, url, accept, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func progressLines(t *testing.T, resp *http.Response) []v1.Progress {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != ndjson || resp.StatusCode != 200 {
		t.Fatalf("streamed answer: %d %s", resp.StatusCode, ct)
	}
	var out []v1.Progress
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var p v1.Progress
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, p)
	}
	return out
}

// TestStreamedProgress: a POST that asks for NDJSON gets the engine's
// reports, then the route's answer with its status; an error ends the
// stream with its kind and status; without asking, the answer is as
// ever; exec never streams.
func TestStreamedProgress(t *testing.T) {
	srv, _ := fakeServer(t)
	lines := progressLines(t, post(t, srv.URL+"/v1/sandboxes/reports/hibernate", "application/x-ndjson, application/json"))
	if len(lines) != 3 {
		t.Fatalf("lines: %+v", lines)
	}
	if want := (v1.Progress{Message: "capturing"}); !reflect.DeepEqual(lines[0], want) {
		t.Errorf("first report %+v", lines[0])
	}
	if want := (v1.Progress{Message: "storing", Done: 10, Total: 10, Unit: "bytes"}); !reflect.DeepEqual(lines[1], want) {
		t.Errorf("second report %+v", lines[1])
	}
	var sb v1.Sandbox
	if last := lines[2]; last.Status != 200 || last.Error != nil || json.Unmarshal(last.Result, &sb) != nil || sb.ID != "reports" || sb.State != v1.StateHibernated {
		t.Errorf("last line %+v (%s)", last, last.Result)
	}

	lines = progressLines(t, post(t, srv.URL+"/v1/sandboxes/nope/hibernate", "application/x-ndjson"))
	if last := lines[len(lines)-1]; last.Status != 404 || last.Error == nil || last.Error.Kind != v1.ErrKindNotFound || last.Result != nil {
		t.Errorf("refused, streamed: %+v", lines)
	}

	// The body is read as without streaming: its checks apply.
	for body, want := range map[string]string{
		`{"image":"x","bogus":1}`:                          "bogus",
		`{"image":"` + strings.Repeat("x", MaxBody) + `"}`: "too large",
	} {
		lines = progressLines(t, postBody(t, srv.URL+"/v1/sandboxes", ndjson, body))
		if last := lines[len(lines)-1]; last.Status != 400 || last.Error == nil || last.Error.Kind != v1.ErrKindInvalidArgument || !strings.Contains(last.Error.Message, want) {
			t.Errorf("streamed create with a bad body: %+v", last)
		}
	}

	// A body that is not JSON (a bundle's tar stream, larger than any
	// JSON body) is read whole, while the answer streams.
	req, err := http.NewRequest("POST", srv.URL+"/v1/checkpoints/import?tenant=count", strings.NewReader(strings.Repeat("x", 3*MaxBody)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-tar")
	req.Header.Set("Accept", ndjson)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines = progressLines(t, resp)
	var imp v1.CheckpointImport
	if last := lines[len(lines)-1]; last.Error != nil || json.Unmarshal(last.Result, &imp) != nil || imp.ObjectBytes != 3*MaxBody || len(lines) < 2 {
		t.Errorf("streamed import: %+v (%+v)", lines, imp)
	}

	resp = post(t, srv.URL+"/v1/sandboxes/reports/hibernate", "")
	if err := json.NewDecoder(resp.Body).Decode(&sb); err != nil || resp.Header.Get("Content-Type") != "application/json" || sb.ID != "reports" {
		t.Errorf("unstreamed: %s %+v %v", resp.Header.Get("Content-Type"), sb, err)
	}

	resp = post(t, srv.URL+"/v1/sandboxes/x/exec", ndjson)
	if resp.Header.Get("Content-Type") == ndjson || resp.StatusCode == 200 {
		t.Errorf("exec streamed: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}
