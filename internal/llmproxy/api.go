package llmproxy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// The API kinds of recognised LLM calls (Call.API).
const (
	APIOpenAIChat        = "openai.chat"
	APIOpenAIResponses   = "openai.responses"
	APIAnthropicMessages = "anthropic.messages"
)

// classify returns the API of an LLM call, or "" when the request does not
// end a turn.
func classify(method, path string) string {
	if method != http.MethodPost {
		return ""
	}
	switch strings.TrimPrefix(path, "/v1") {
	case "/chat/completions":
		return APIOpenAIChat
	case "/responses":
		return APIOpenAIResponses
	case "/messages":
		return APIAnthropicMessages
	}
	return ""
}

// forwardedPaths are the LLM API paths the proxy forwards (and adds the
// operator's credentials to), after an optional leading "/v1"; "*" is one
// path segment (an ID). OpenAI's and Anthropic's inference and model
// listing APIs; not files, batches, fine-tuning, organisation or admin
// APIs, which the operator's key may also open.
var forwardedPaths = [][]string{
	{"chat", "completions"}, // OpenAI
	{"completions"},
	{"embeddings"},
	{"responses"},
	{"responses", "input_tokens"},
	{"responses", "*"},
	{"responses", "*", "cancel"},
	{"responses", "*", "input_items"},
	{"messages"}, // Anthropic
	{"messages", "count_tokens"},
	{"models"}, // both
	{"models", "*"},
}

// forwarded reports whether the proxy forwards a request for path.
func forwarded(path string) bool {
	rest, ok := strings.CutPrefix(path, "/")
	if !ok {
		return false
	}
	if hasV1(path) {
		rest = strings.TrimPrefix(strings.TrimPrefix(path, "/v1"), "/")
	}
	segs := strings.Split(rest, "/")
	for _, pat := range forwardedPaths {
		if len(pat) != len(segs) {
			continue
		}
		match := true
		for i, s := range pat {
			if s == "*" {
				if seg := segs[i]; seg == "" || seg == "." || seg == ".." {
					match = false
				}
			} else if segs[i] != s {
				match = false
			}
		}
		if match {
			return true
		}
	}
	return false
}

// hasV1 reports whether path starts with the segment "/v1".
func hasV1(path string) bool {
	return path == "/v1" || strings.HasPrefix(path, "/v1/")
}

// mapPath joins the request path onto the upstream's path prefix (see the
// package documentation): the request path is kept as-is, except that a
// leading "/v1" segment is dropped when the prefix already ends with one.
// It works alike on decoded and escaped paths.
func mapPath(prefix, path string) string {
	prefix = strings.TrimRight(prefix, "/")
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	if strings.HasSuffix(prefix, "/v1") && hasV1(path) {
		path = path[len("/v1"):]
	}
	return prefix + path
}

// joinQuery puts the upstream's query before the request's.
func joinQuery(upstream, req string) string {
	switch {
	case upstream == "":
		return req
	case req == "":
		return upstream
	}
	return upstream + "&" + req
}

// parseBody reads the model and the stream flag of an LLM request body; a
// body that is not a JSON object, or fields of other types, yield zero values.
func parseBody(body []byte) (model string, stream bool) {
	var v struct {
		Model  json.RawMessage `json:"model"`
		Stream json.RawMessage `json:"stream"`
	}
	if json.Unmarshal(body, &v) != nil {
		return "", false
	}
	if json.Unmarshal(v.Model, &model) != nil {
		model = ""
	}
	return model, bytes.Equal(v.Stream, []byte("true"))
}

// anthropicStyle reports whether errors for a request are written in
// Anthropic's shape: always for anthropic.messages, and for other requests
// that look like Anthropic's (an anthropic-version header or a /messages
// path); OpenAI's shape otherwise.
func anthropicStyle(api string, r *http.Request) bool {
	if api != "" {
		return api == APIAnthropicMessages
	}
	p := strings.TrimPrefix(r.URL.Path, "/v1")
	return r.Header.Get("Anthropic-Version") != "" || p == "/messages" || strings.HasPrefix(p, "/messages/")
}

// errorBody is the JSON error the agent receives when the proxy itself fails
// a request, in the style of the API the agent speaks. kind is the error type
// OpenAI-style clients see; Anthropic-style clients see akind.
func errorBody(anthropic bool, kind, akind, msg string) []byte {
	var v any
	if anthropic {
		v = map[string]any{
			"type":  "error",
			"error": map[string]string{"type": akind, "message": msg},
		}
	} else {
		v = map[string]any{
			"error": map[string]string{"message": msg, "type": kind},
		}
	}
	b, _ := json.Marshal(v)
	return append(b, '\n')
}
