package v1

import "encoding/json"

// Progress is one line of a streamed long operation (NDJSON): either a
// progress report, or the final result, or the final error.
//
// Every POST of the API but exec streams when asked with `Accept:
// application/x-ndjson` (docs/api.md, "Progress"): reports as the
// operation goes, then one line with the answer the route gives
// otherwise, as Result with its Status, or as Error with its Status.
// The image build always streams, and ends with Image.
type Progress struct {
	// Message names the stage the operation is in.
	Message string `json:"message,omitempty"`
	// Done and Total measure the stage in Unit ("bytes", or a count
	// when empty), when it can be measured (Total > 0).
	Done  int64  `json:"done,omitempty"`
	Total int64  `json:"total,omitempty"`
	Unit  string `json:"unit,omitempty"`
	// Image ends an image build.
	Image *Image `json:"image,omitempty"`
	// Result ends a streamed route: its answer's body, as the route
	// gives it without streaming.
	Result json.RawMessage `json:"result,omitempty"`
	// Status is the HTTP status the route's answer had, on the line of
	// its Result or Error.
	Status int    `json:"status,omitempty"`
	Error  *Error `json:"error,omitempty"`
}
