package ledger

import "testing"

// TestOnAppend: the hook sees each record Begin appends and Finish
// completes, after the write, and nothing once unset.
func TestOnAppend(t *testing.T) {
	l, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var got []Record
	l.OnAppend(func(r Record) { got = append(got, r) })
	r, err := l.Begin("sb", Record{Kind: Effect, Request: Identity{Proto: "https", Method: "POST", URL: "https://api.example/v1/x?k=secret"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Finish("sb", r.ID, Completed, &Response{Status: 201}, ""); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != r.ID || got[0].State != Pending || got[1].ID != r.ID || got[1].State != Completed {
		t.Fatalf("hook saw %+v", got)
	}
	l.OnAppend(nil)
	if _, err := l.Begin("sb", Record{Kind: Read, Request: Identity{Proto: "dns", Host: "example"}}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("hook called after being unset: %d calls", len(got))
	}
}
