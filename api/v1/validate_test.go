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
