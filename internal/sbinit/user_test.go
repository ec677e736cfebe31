package sbinit

import "testing"

// An OCI image's User may name its group ("nobody:nogroup").
func TestGroupID(t *testing.T) {
	groups := []byte("root:x:0:\nnogroup:x:65534:\nstaff:x:50:alice\n")
	for name, want := range map[string]uint64{"root": 0, "nogroup": 65534, "staff": 50} {
		if got, err := groupID(groups, name); err != nil || got != want {
			t.Errorf("groupID(%q) = %d %v, want %d", name, got, err, want)
		}
	}
	if _, err := groupID(groups, "nosuch"); err == nil {
		t.Error("an unknown group was found")
	}
}
