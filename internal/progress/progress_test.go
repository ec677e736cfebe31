package progress

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

type sink struct {
	mu    sync.Mutex
	steps []Step
}

func (s *sink) f(st Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps = append(s.steps, st)
}

func TestReportAndLines(t *testing.T) {
	Report(context.Background(), Step{Message: "nobody listens"}) // no panic
	if Enabled(context.Background()) {
		t.Fatal("a bare context has a receiver")
	}
	var s sink
	ctx := With(context.Background(), s.f)
	if !Enabled(ctx) {
		t.Fatal("With gave no receiver")
	}
	w := Lines(ctx, "build: ")
	fmt.Fprint(w, "I: Retrieving\r\nI: Valid")
	fmt.Fprint(w, "ating\n\nlast without newline")
	want := []Step{{Message: "build: I: Retrieving"}, {Message: "build: I: Validating"}}
	if !reflect.DeepEqual(s.steps, want) {
		t.Fatalf("lines: %+v, want %+v", s.steps, want)
	}
	// A line without end is bounded, not kept whole.
	fmt.Fprint(w, strings.Repeat("x", 2*maxLine))
	if n := len(w.(*lineWriter).buf); n > maxLine {
		t.Fatalf("kept %d bytes of an endless line", n)
	}
}

func TestReader(t *testing.T) {
	var s sink
	ctx := With(context.Background(), s.f)
	r := Reader(ctx, strings.NewReader(strings.Repeat("a", 10000)), "importing", 10000)
	b := make([]byte, 4096)
	total := 0
	for {
		n, err := r.Read(b)
		total += n
		if err == io.EOF {
			break
		}
	}
	last := s.steps[len(s.steps)-1]
	if total != 10000 || last.Done != 10000 || last.Total != 10000 || last.Unit != "bytes" {
		t.Fatalf("read %d, last report %+v", total, last)
	}
	if r := Reader(context.Background(), strings.NewReader("x"), "m", 1); reflect.TypeOf(r) == reflect.TypeOf(&countReader{}) {
		t.Fatal("a reader was wrapped with no receiver")
	}
}

func TestThrottle(t *testing.T) {
	var s sink
	f := Throttle(s.f, time.Hour)
	for i := range 100 {
		f(Step{Message: "storing", Done: int64(i), Total: 100})
	}
	f(Step{Message: "storing", Done: 100, Total: 100})
	f(Step{Message: "next"})
	f(Step{Message: "next"})
	got := []string{}
	for _, st := range s.steps {
		got = append(got, fmt.Sprintf("%s %d", st.Message, st.Done))
	}
	if want := []string{"storing 0", "storing 100", "next 0"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("throttled: %q, want %q", got, want)
	}
}
