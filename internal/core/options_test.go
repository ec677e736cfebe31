package core

import "testing"

// TestOptions: each option switches off its own optimization and no
// other (runs without root).
func TestOptions(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  Option
		want options
	}{
		{"WithoutScheduler", WithoutScheduler(), options{noScheduler: true}},
		{"WithoutFavorDynMods", WithoutFavorDynMods(), options{noFavorDynMods: true}},
		{"WithoutCOWCapture", WithoutCOWCapture(), options{noCOWCapture: true}},
		{"WithoutTemplateCapture", WithoutTemplateCapture(), options{noTemplateCapture: true}},
		{"WithoutDiskQuota", WithoutDiskQuota(), options{noDiskQuota: true}},
	} {
		var got options
		c.opt(&got)
		if got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
