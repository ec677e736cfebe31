package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --secret reads NAME=@FILE (a trailing newline dropped) and --secret-env
// this command's environment; a value given on the command line is
// refused without being echoed.
func TestParseSecrets(t *testing.T) {
	f := filepath.Join(t.TempDir(), "s")
	if err := os.WriteFile(f, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOLT_TEST_SECRET", "from-env")
	got, err := parseSecrets([]string{"A=@" + f}, []string{"MOLT_TEST_SECRET"})
	if err != nil || got["A"] != "from-file" || got["MOLT_TEST_SECRET"] != "from-env" || len(got) != 2 {
		t.Fatalf("parseSecrets = %v, %v", got, err)
	}
	if _, err := parseSecrets([]string{"A=inline-value"}, nil); err == nil || strings.Contains(err.Error(), "inline-value") {
		t.Errorf("an inline value: %v", err)
	}
	if _, err := parseSecrets(nil, []string{"MOLT_TEST_NOT_SET"}); err == nil {
		t.Error("a missing environment variable is accepted")
	}
	if _, err := parseSecrets([]string{"A=@" + f + ".missing"}, nil); err == nil {
		t.Error("a missing file is accepted")
	}
}
