package revert

import (
	"bytes"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"testing"
)

func TestFailUndoesInReverse(t *testing.T) {
	var got []int
	r := New()
	for i := 1; i <= 3; i++ {
		r.Add(func() error { got = append(got, i); return nil })
	}
	r.Add(func() error { return errors.New("undo failed") })
	r.Fail()
	if want := []int{3, 2, 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("undo order %v, want %v", got, want)
	}
	if r.Err == nil {
		t.Fatal("undo error was lost")
	}
	r.Fail()
	if len(got) != 3 {
		t.Fatal("second Fail ran undo again")
	}
}

func TestSuccessKeeps(t *testing.T) {
	ran := false
	r := New()
	r.Add(func() error { ran = true; return nil })
	r.Success()
	r.Fail()
	if ran {
		t.Fatal("undo ran after Success")
	}
}

// A Logged reverter logs each undo that fails, with the operation.
func TestLoggedLogsUndoErrors(t *testing.T) {
	var buf bytes.Buffer
	r := Logged(slog.New(slog.NewTextHandler(&buf, nil)), "make sandbox x")
	r.Add(func() error { return errors.New("first") })
	r.Add(func() error { return nil })
	r.Add(func() error { return errors.New("second") })
	r.Fail()
	out := buf.String()
	for _, want := range []string{"op=\"make sandbox x\"", "err=first", "err=second"} {
		if !strings.Contains(out, want) {
			t.Fatalf("log lacks %s:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n != 2 {
		t.Fatalf("%d log lines, want one per failed undo:\n%s", n, out)
	}
}
