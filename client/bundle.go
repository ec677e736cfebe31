package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	v1 "github.com/molt-sh/molt/api/v1"
)

// exportErrorTrailer names the error of an export cut after its response
// began (internal/httpapi.ExportErrorTrailer).
const exportErrorTrailer = "Molt-Export-Error"

// ExportCheckpoint writes checkpoint ref as a portable bundle to w
// (docs/bundles.md). An error after bytes were written leaves w with a
// bundle no import accepts.
func (c *Client) ExportCheckpoint(ctx context.Context, ref string, w io.Writer) (int64, error) {
	resp, err := c.send(ctx, "GET", "/v1/checkpoints/"+esc(ref)+"/export", nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("export %s: %w", ref, err)
	}
	if msg := resp.Trailer.Get(exportErrorTrailer); msg != "" {
		return n, &APIError{Status: http.StatusInternalServerError, Kind: v1.ErrKindInternal, Message: msg}
	}
	return n, nil
}

// ImportCheckpoint sends the bundle read from r to the daemon, which
// verifies it and makes its checkpoint one of tenant's ("" the token's
// tenant, or none for the host admin).
func (c *Client) ImportCheckpoint(ctx context.Context, r io.Reader, tenant string) (v1.CheckpointImport, error) {
	p := "/v1/checkpoints/import"
	if tenant != "" {
		p += "?tenant=" + url.QueryEscape(tenant)
	}
	req, err := http.NewRequestWithContext(ctx, "POST", "http://molt"+p, io.NopCloser(r))
	if err != nil {
		return v1.CheckpointImport{}, err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	if progressOf(ctx) != nil {
		req.Header.Set("Accept", "application/x-ndjson, application/json")
	}
	c.authorize(req)
	resp, err := c.http().Do(req)
	if err != nil {
		return v1.CheckpointImport{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return v1.CheckpointImport{}, decodeError(resp)
	}
	var out v1.CheckpointImport
	if streamed(resp) {
		return out, readStream(resp, "POST", p, progressOf(ctx), &out)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("import: decode response: %w", err)
	}
	return out, nil
}
