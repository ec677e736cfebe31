package ledger

import (
	"fmt"
	"os"
	"testing"
)

// benchDir is where the benchmarks write: $MOLT_LEDGER_BENCH_DIR (to
// measure the daemon's own filesystem) or a temporary directory.
func benchDir(b *testing.B) string {
	if d := os.Getenv("MOLT_LEDGER_BENCH_DIR"); d != "" {
		d, err := os.MkdirTemp(d, "ledger-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	return b.TempDir()
}

func benchBegin(b *testing.B, k Kind) {
	l := open(b, benchDir(b))
	id := post("/charge", `{"amount":5,"currency":"eur"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Begin("bench", Record{Kind: k, Request: id}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBeginRead is an append whose sync is left to the group commit.
func BenchmarkBeginRead(b *testing.B) { benchBegin(b, Read) }

// BenchmarkBeginEffect is an append and its fdatasync.
func BenchmarkBeginEffect(b *testing.B) { benchBegin(b, Effect) }

// BenchmarkBeginEffectParallel has concurrent effects share fdatasyncs.
func BenchmarkBeginEffectParallel(b *testing.B) {
	l := open(b, benchDir(b))
	id := post("/charge", `{"amount":5}`)
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Begin("bench", Record{Kind: Effect, Request: id}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkMatch10k looks a request up in a ledger of 10,000 records
// after a rewind to the start has orphaned all of them.
func BenchmarkMatch10k(b *testing.B) {
	l := open(b, benchDir(b))
	var want string
	for i := range 10000 {
		k := Read
		if i%2 == 0 {
			k = Effect
		}
		r, err := l.Begin("bench", Record{Kind: k, State: Completed, Request: post(fmt.Sprintf("/%d", i%500), fmt.Sprintf(`{"n":%d}`, i)), Response: &Response{Status: 200}})
		if err != nil {
			b.Fatal(err)
		}
		if i == 5000 {
			want = r.ID
		}
	}
	if err := l.Rewind("bench", ""); err != nil {
		b.Fatal(err)
	}
	id := post("/0", `{"n":5000}`)
	b.ReportAllocs()
	for b.Loop() {
		if m := l.Match("bench", id); m.Orphan == nil || m.Orphan.ID != want {
			b.Fatalf("match %+v", m)
		}
	}
}

// BenchmarkCanonJSON is the identity of a JSON POST.
func BenchmarkCanonJSON(b *testing.B) {
	c := Canon{IgnoreJSONFields: []string{"timestamp"}}
	h := jsonHeader()
	h.Set("Authorization", "Bearer x")
	h.Set("User-Agent", "bench")
	body := []byte(`{"amount":500,"currency":"eur","timestamp":1764547200,"customer":{"id":"cus_1","email":"a@example.com"},"items":[{"sku":"a","qty":1},{"sku":"b","qty":2}]}`)
	u := mustURL(b, "/v1/charges?expand=customer&b=1")
	b.ReportAllocs()
	for b.Loop() {
		c.HTTP("https", "POST", "api.example.com", u, h, body)
	}
}
