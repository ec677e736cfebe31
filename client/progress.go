package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"

	v1 "github.com/molt-sh/molt/api/v1"
)

type progressKey struct{}

// WithProgress returns ctx with f receiving the progress of the calls
// made with it: every POST but exec asks the daemon to stream its answer
// (Accept: application/x-ndjson) and hands f each report as it comes
// (an image build's log lines too). The call's result and error are as
// without progress.
func WithProgress(ctx context.Context, f func(v1.Progress)) context.Context {
	return context.WithValue(ctx, progressKey{}, f)
}

func progressOf(ctx context.Context) func(v1.Progress) {
	f, _ := ctx.Value(progressKey{}).(func(v1.Progress))
	return f
}

// streamed reports whether resp is a stream of v1.Progress lines.
func streamed(resp *http.Response) bool {
	t, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return err == nil && t == "application/x-ndjson"
}

// readStream reads a streamed answer: reports go to f, and the last
// line's result into out (or its error is returned).
func readStream(resp *http.Response, method, path string, f func(v1.Progress), out any) error {
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 32<<20)
	for sc.Scan() {
		var p v1.Progress
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			return fmt.Errorf("%s %s: decode progress: %w", method, path, err)
		}
		switch {
		case p.Error != nil:
			st := p.Status
			if st == 0 {
				st = http.StatusOK
			}
			return &APIError{Status: st, Kind: p.Error.Kind, Message: p.Error.Message, Candidates: p.Error.Candidates}
		case p.Result != nil:
			if out == nil {
				return nil
			}
			if err := json.Unmarshal(p.Result, out); err != nil {
				return fmt.Errorf("%s %s: decode response: %w", method, path, err)
			}
			return nil
		case f != nil:
			f(p)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	return errors.New(method + " " + path + ": the daemon closed the stream without an answer")
}
