package revert

import (
	"errors"
	"reflect"
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
