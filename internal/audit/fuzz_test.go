package audit

import (
	"bytes"
	"testing"
)

// FuzzVerify: an exported file is untrusted input to `molt audit verify
// FILE`; whatever it holds, Verify answers without panicking, and a file
// it accepts chains from its first seq to its head.
func FuzzVerify(f *testing.F) {
	var log []byte
	prev := ZeroHash
	for i := uint64(1); i <= 3; i++ {
		line, sum, err := encode(Entry{Seq: i, Prev: prev, Kind: KindAPI, Route: "GET /v1/host", Status: 200})
		if err != nil {
			f.Fatal(err)
		}
		log, prev = append(log, line...), sum
	}
	f.Add(log)
	f.Add(log[:len(log)-5])
	f.Add([]byte(`{"seq":1,"hash":"x"}` + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := Verify(bytes.NewReader(b), nil)
		if r.OK && r.Entries > 0 && r.Head.Seq != r.FirstSeq+uint64(r.Entries)-1 {
			t.Fatalf("accepted a chain of %d entries from seq %d to %d", r.Entries, r.FirstSeq, r.Head.Seq)
		}
		if !r.OK && r.Problem == "" {
			t.Fatal("a failure without a reason")
		}
	})
}
