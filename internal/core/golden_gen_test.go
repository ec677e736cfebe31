package core

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/hot"
	"github.com/molt-sh/molt/internal/store"
)

func fillGolden(v reflect.Value, name string, n *int) {
	*n++
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, 6789, time.UTC).Add(time.Duration(*n) * time.Second)))
			return
		}
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fillGolden(v.Field(i), name+"."+v.Type().Field(i).Name, n)
			}
		}
	case reflect.String:
		v.SetString(name)
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint64, reflect.Uint32:
		v.SetUint(uint64(*n))
	case reflect.Float64:
		v.SetFloat(float64(*n) + 0.25)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := 0; i < 2; i++ {
			fillGolden(s.Index(i), name, n)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for i := 0; i < 2; i++ {
			k := reflect.New(v.Type().Key()).Elem()
			fillGolden(k, name+".k"+string(rune('a'+i)), n)
			e := reflect.New(v.Type().Elem()).Elem()
			fillGolden(e, name+".v", n)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fillGolden(p.Elem(), name, n)
		v.Set(p)
	}
}

// TestGenerateGolden writes the records of each bucket as this build
// encodes them (MOLT_GOLDEN_OUT=dir).
func TestGenerateGolden(t *testing.T) {
	out := os.Getenv("MOLT_GOLDEN_OUT")
	if out == "" {
		t.Skip("MOLT_GOLDEN_OUT not set")
	}
	db, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	recs := map[string]func() any{
		store.Images:            func() any { return &v1.Image{} },
		store.Sandboxes:         func() any { return &sandboxRec{} },
		store.Checkpoints:       func() any { return &checkpointRec{} },
		store.FailedCheckpoints: func() any { return &checkpointRec{} },
		store.Turns:             func() any { return &v1.TurnRecord{} },
		store.Takeovers:         func() any { return &hot.Record{} },
	}
	for bucket, mk := range recs {
		full := mk()
		n := 0
		fillGolden(reflect.ValueOf(full).Elem(), "x", &n)
		for key, v := range map[string]any{"full": full, "zero": mk()} {
			if err := db.Put(bucket, key, v); err != nil {
				t.Fatal(err)
			}
			var raw []byte
			if err := db.ForEachPrefix(bucket, key, func(_ string, b []byte) error { raw = append([]byte(nil), b...); return nil }); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(out, bucket+"."+key+".json"), raw, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
