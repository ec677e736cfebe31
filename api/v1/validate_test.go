package v1

import (
	"strings"
	"testing"
)

func TestSandboxCreateSeccomp(t *testing.T) {
	big := `{"defaultAction": "SCMP_ACT_ALLOW", "x": "` + strings.Repeat("a", MaxSeccompProfileBytes) + `"}`
	for _, c := range []struct {
		mode, profile string
		ok            bool
	}{
		{"", "", true},
		{SeccompDefault, "", true},
		{SeccompUnconfined, "", true},
		{SeccompCustom, `{"defaultAction": "SCMP_ACT_ALLOW"}`, true},
		{"", `{"defaultAction": "SCMP_ACT_ALLOW"}`, true},
		{SeccompCustom, "", false},
		{SeccompDefault, `{"defaultAction": "SCMP_ACT_ALLOW"}`, false},
		{"/etc/profile.json", "", false},
		{"", "{not json", false},
		{"", big, false},
	} {
		err := SandboxCreateRequest{Image: "debian", Seccomp: c.mode, SeccompProfile: c.profile}.Validate()
		if (err == nil) != c.ok {
			p := c.profile
			if len(p) > 40 {
				p = p[:40] + "..."
			}
			t.Errorf("seccomp %q, profile %q: %v", c.mode, p, err)
		}
	}
}

// The kind auto ends a turn, whose end decides the kind: it takes no
// wait nor keep; keep is a full checkpoint's. This is the one place the
// rule is written (the CLI, the HTTP layer and core call it).
func TestCheckpointRequestValidate(t *testing.T) {
	for _, c := range []struct {
		req CheckpointRequest
		ok  bool
	}{
		{CheckpointRequest{}, true},
		{CheckpointRequest{Kind: KindFS, Wait: true}, true},
		{CheckpointRequest{Kind: KindFull, Wait: true, Keep: true}, true},
		{CheckpointRequest{Kind: KindAuto, Label: "x"}, true},
		{CheckpointRequest{Kind: KindAuto, Wait: true}, false},
		{CheckpointRequest{Kind: KindAuto, Keep: true}, false},
		{CheckpointRequest{Kind: KindFS, Keep: true}, false},
		{CheckpointRequest{Keep: true}, false},
		{CheckpointRequest{Kind: "memory"}, false},
	} {
		if err := c.req.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok=%v", c.req, err, c.ok)
		}
	}
}
