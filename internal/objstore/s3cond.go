package objstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/minio/minio-go/v7"

	"github.com/molt-sh/molt/internal/errdefs"
)

var (
	_ Bucket = (*S3)(nil)
	_ Bucket = (*Dir)(nil)
)

// An S3 object's version is its ETag. PutIf sends If-Match with it, or
// If-None-Match: * for an object that must not exist (S3's conditional
// writes; versitygw checks and publishes under a lock per key).

func (s *S3) ReadVersion(ctx context.Context, key string, max int64) ([]byte, string, error) {
	name, err := s.name(key)
	if err != nil {
		return nil, "", err
	}
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	body, info, _, err := minio.Core{Client: s.client}.GetObject(ctx, s.bucket, name, minio.GetObjectOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("get %s from %s: %w", key, s, s.fail(ctx, err))
	}
	defer body.Close()
	etag := strings.Trim(info.ETag, `"`)
	if info.Size > max {
		return nil, "", fmt.Errorf("get %s from %s: %d bytes, more than the %d allowed: %w", key, s, info.Size, max, errdefs.ErrFailedPrecondition)
	}
	if etag == "" {
		return nil, "", fmt.Errorf("get %s from %s: the answer has no ETag, so the object cannot be changed on condition: %w", key, s, errdefs.ErrNotSupported)
	}
	b, err := io.ReadAll(io.LimitReader(body, max+1))
	if err != nil {
		return nil, "", fmt.Errorf("get %s from %s: %w", key, s, s.fail(ctx, err))
	}
	if int64(len(b)) > max || (info.Size >= 0 && int64(len(b)) != info.Size) {
		return nil, "", fmt.Errorf("get %s from %s: %d bytes read, %d announced (at most %d): %w", key, s, len(b), info.Size, max, errdefs.ErrUnavailable)
	}
	return b, etag, nil
}

func (s *S3) PutIf(ctx context.Context, key string, data []byte, version string) error {
	name, err := s.name(key)
	if err != nil {
		return err
	}
	if err := conditional(ctx, key, data); err != nil {
		return err
	}
	var o minio.PutObjectOptions
	if version == "" {
		o.SetMatchETagExcept("*")
	} else {
		o.SetMatchETag(version)
	}
	_, err = s.client.PutObject(ctx, s.bucket, name, bytes.NewReader(data), int64(len(data)), o)
	if err == nil {
		return nil
	}
	var r minio.ErrorResponse
	lost := errors.As(err, &r) && (r.StatusCode == http.StatusPreconditionFailed || r.StatusCode == http.StatusConflict ||
		(version != "" && r.Code == minio.NoSuchKey))
	if !lost {
		return fmt.Errorf("put %s to %s: %w", key, s, s.fail(ctx, err))
	}
	// A request retried after its answer was lost finds its own write:
	// what is there now is exactly these bytes (a document carries its
	// time and signature, so another writer's never is).
	if cur, _, rerr := s.ReadVersion(ctx, key, MaxConditional); rerr == nil && bytes.Equal(cur, data) {
		return nil
	}
	return fmt.Errorf("put %s to %s: %w", key, s, ErrChanged)
}
