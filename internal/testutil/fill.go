package testutil

import (
	"fmt"
	"net/netip"
	"reflect"
	"time"
)

// Fill sets every exported field of v, each to a value of its own: the
// path of field names from name for strings, a counter (n) for numbers
// and times, true for booleans, two elements for slices and maps. Tests
// use it to show that a conversion or an encoding carries every field;
// internal/meta's golden records were made with it, so what it gives
// must not change. A kind it has no value for is a test's mistake: it
// panics.
func Fill(v reflect.Value, name string, n *int) {
	*n++
	switch v.Kind() {
	case reflect.Struct:
		switch v.Type() {
		case reflect.TypeOf(time.Time{}):
			v.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, 6789, time.UTC).Add(time.Duration(*n) * time.Second)))
			return
		case reflect.TypeOf(netip.Addr{}):
			v.Set(reflect.ValueOf(netip.AddrFrom4([4]byte{10, 0, byte(*n >> 8), byte(*n)})))
			return
		case reflect.TypeOf(netip.Prefix{}):
			v.Set(reflect.ValueOf(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(*n), 0, 0}), 16)))
			return
		}
		for i := 0; i < v.NumField(); i++ {
			if f := v.Type().Field(i); f.IsExported() {
				Fill(v.Field(i), name+"."+f.Name, n)
			}
		}
	case reflect.String:
		v.SetString(name)
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint64, reflect.Uint32, reflect.Uint16, reflect.Uint8:
		v.SetUint(uint64(*n))
	case reflect.Float64:
		v.SetFloat(float64(*n) + 0.25)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := 0; i < 2; i++ {
			Fill(s.Index(i), name, n)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for i := 0; i < 2; i++ {
			k := reflect.New(v.Type().Key()).Elem()
			Fill(k, name+".k"+string(rune('a'+i)), n)
			e := reflect.New(v.Type().Elem()).Elem()
			Fill(e, name+".v", n)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		Fill(p.Elem(), name, n)
		v.Set(p)
	default:
		panic(fmt.Sprintf("%s: Fill has no value for a %s", name, v.Kind()))
	}
}
