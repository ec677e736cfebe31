// Package llmproxy is an HTTP reverse proxy that an agent uses as its LLM
// base URL. An LLM call through it ends the agent's current turn: the proxy
// tells its Hooks (TurnEnd), which start the turn's checkpoint, forwards the
// call upstream at once so that the model's time runs concurrently with the
// checkpoint, and holds the reply back (the gate) until the checkpoint has
// reached its consistent instant. Every LLM call is then reported whole
// (Recorded), with bounded copies of the request and response bodies.
//
// # Token and forwarded paths
//
// The proxy adds the operator's credentials (Config.Header) to what it
// forwards, so it serves only requests that carry the endpoint's token
// (Config.Token): as the path's first segments "/t/TOKEN", which is
// removed before anything else sees the path, or as the API key an SDK
// sends (Authorization: Bearer, x-api-key, api-key), which is removed
// before forwarding. Others get 401. Only the LLM API's paths
// (forwardedPaths: inference, token counting, model listing) are
// forwarded; others get 403, so the credentials never reach the
// upstream's file, batch, fine-tuning or admin APIs.
//
// # Recognised LLM calls
//
// Only POST requests to these paths end a turn; the leading "/v1" may be
// absent, since some SDKs put it in the base URL:
//
//	/v1/chat/completions   openai.chat
//	/v1/responses          openai.responses
//	/v1/messages           anthropic.messages
//
// Other forwarded paths (GET /v1/models, /v1/messages/count_tokens, ...) go
// through without ending a turn, without hooks and without recording. The paths are
// matched as the proxy receives them: the agent's base URL is the proxy's
// root or its root plus "/v1"; to serve under another prefix, mount the
// Proxy (an http.Handler) with http.StripPrefix.
//
// # Path mapping
//
// The request path is forwarded as-is, joined onto the upstream's scheme,
// host and path prefix, with one exception: when the upstream's path ends in
// the segment "/v1" and the request path starts with the segment "/v1", the
// request's "/v1" is dropped so that it is not doubled. The upstream's query,
// if any, comes first, then the request's. With upstream
// https://api.x.com/v1:
//
//	/v1/chat/completions -> https://api.x.com/v1/chat/completions
//	/chat/completions    -> https://api.x.com/v1/chat/completions
//	/v1/models           -> https://api.x.com/v1/models
//
// With upstream https://api.x.com (no prefix) the path is kept unchanged, so
// an agent whose base URL lacks "/v1" then reaches https://api.x.com/chat/completions;
// give the upstream with its "/v1" to serve both kinds of agent. Other
// prefixes are kept: upstream https://gw.example/openai maps
// /v1/chat/completions to https://gw.example/openai/v1/chat/completions.
package llmproxy
