package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
)

// requestTypes are the bodies the API decodes, each as its handler
// prepares it before decoding.
var requestTypes = []func() any{
	func() any { return &v1.ImageBuildRequest{} },
	func() any { return &v1.ImageImportRequest{} },
	func() any { return &v1.SandboxCreateRequest{} },
	func() any { return &v1.ExecRequest{} },
	func() any { return &v1.SessionRunRequest{} },
	func() any { return &v1.CheckpointRequest{} },
	func() any { return &v1.TurnRequest{} },
	func() any { return &v1.RollbackRequest{} },
	func() any { return &v1.ForkRequest{N: 1} },
	func() any { return &v1.LLMEndpointRequest{} },
}

// jsonFields are the top-level JSON names of the struct v points to.
func jsonFields(v any) []string {
	t := reflect.TypeOf(v).Elem()
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		names = append(names, name)
	}
	return names
}

// FuzzDecodeBody decodes arbitrary bytes as each request type (the first
// argument picks it). What DecodeBody accepts is one JSON value and
// nothing after it, has only fields the type knows, passes the type's
// Validate, and survives a round trip; a refusal is invalid_argument;
// anything after an accepted value makes it refused.
func FuzzDecodeBody(f *testing.F) {
	// Seeds: testdata/fuzz/FuzzDecodeBody.
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		mk := requestTypes[int(kind)%len(requestTypes)]
		v := mk()
		err := DecodeBody(bytes.NewReader(body), v)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("%T %q refused as %v, not invalid_argument", v, body, err)
			}
			return
		}
		if trimmed := bytes.TrimSpace(body); len(trimmed) > 0 {
			if !json.Valid(trimmed) {
				t.Fatalf("%T: accepted %q, which is not one JSON value", v, body)
			}
			var top map[string]json.RawMessage
			if json.Unmarshal(trimmed, &top) == nil {
				known := jsonFields(v)
				for k := range top {
					found := false
					for _, n := range known {
						found = found || strings.EqualFold(k, n)
					}
					if !found {
						t.Fatalf("%T: accepted unknown field %q", v, k)
					}
				}
			}
			for _, tail := range []string{"{}", "x", "0", `"`, "]"} {
				if DecodeBody(bytes.NewReader(append(append([]byte{}, body...), tail...)), mk()) == nil {
					t.Fatalf("%T: accepted %q followed by %q", v, body, tail)
				}
			}
		}
		if val, ok := v.(interface{ Validate() error }); ok {
			if err := val.Validate(); err != nil {
				t.Fatalf("%T: accepted %q, which Validate refuses: %v", v, body, err)
			}
		}
		enc, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("%T: marshal accepted value: %v", v, err)
		}
		again := mk()
		if err := DecodeBody(bytes.NewReader(enc), again); err != nil {
			t.Fatalf("%T: %q accepted, its encoding %s refused: %v", v, body, enc, err)
		}
		if enc2, _ := json.Marshal(again); !bytes.Equal(enc, enc2) {
			t.Fatalf("%T: round trip changed %s to %s", v, enc, enc2)
		}
	})
}

// A body over MaxBody is refused, even when what fits is a request
// followed by white space.
func TestBodyLimit(t *testing.T) {
	body := `{"image":"x"}` + strings.Repeat(" ", MaxBody) + `{"image":"y"}`
	r := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(body))
	var req v1.SandboxCreateRequest
	if err := decode(httptest.NewRecorder(), r, &req); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("decode of %d bytes: %v, want invalid_argument", len(body), err)
	}
}
