package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/minio/minio-go/v7"

	"github.com/molt-sh/molt/internal/errdefs"
)

// S3Options says where an S3 bucket is served and how to sign.
type S3Options struct {
	// Endpoint is the server's http:// or https:// URL, without a path;
	// "" is Amazon S3 (https://s3.amazonaws.com). An endpoint that is not
	// Amazon's (*.amazonaws.com) is addressed path-style
	// (http://host/BUCKET/KEY), which every S3-compatible server
	// understands.
	Endpoint string
	// Region signs the requests; "" is AWS_REGION (or
	// AWS_DEFAULT_REGION), else us-east-1 on a custom endpoint and the
	// bucket's own region, asked once, on Amazon S3.
	Region string
	// Creds, when set, are used instead of those of the environment
	// and the shared credentials file (s3Creds).
	Creds *Credentials
}

// DefaultS3Endpoint is Amazon S3.
const DefaultS3Endpoint = "https://s3.amazonaws.com"

// s3PartSize is the size of an upload's parts: an object larger is
// sent as a multipart upload, one part buffered at a time.
const s3PartSize = 16 << 20

// maxListKeys bounds a listing, so a server that pages forever cannot
// grow it without end.
const maxListKeys = 1 << 22

// maxPrefix bounds a bucket's prefix: with a key (MaxKey) it stays
// within S3's 1024 bytes.
const maxPrefix = 256

// S3 is a Bucket of objects under PREFIX/ in a bucket of an
// S3-compatible server. Its Stats count HTTP requests (a multipart
// upload is several, a listing one per page of 1000 keys) and the
// bytes of their bodies, both ways. Retries of transient failures are
// minio-go's (up to 10, with backoff, for requests it can replay); a
// context's cancellation ends any request.
type S3 struct {
	client   *minio.Client
	tr       *http.Transport
	bucket   string
	prefix   string // "" or a ValidKey, objects are prefix/key
	endpoint string // for messages
	counter
}

// OpenS3 opens the bucket of url, "s3://BUCKET" or
// "s3://BUCKET/PREFIX", on the server of o, and checks that it exists
// and that the credentials may list it (one request; the layers above
// need s3:ListBucket, s3:GetObject, s3:PutObject, s3:DeleteObject and
// s3:AbortMultipartUpload).
func OpenS3(ctx context.Context, rawURL string, o S3Options) (*S3, error) {
	bucket, prefix, err := ParseS3URL(rawURL)
	if err != nil {
		return nil, err
	}
	if o.Endpoint == "" {
		o.Endpoint = DefaultS3Endpoint
	}
	ep, err := parseEndpoint(o.Endpoint)
	if err != nil {
		return nil, err
	}
	creds, source, err := s3Creds(ctx, o)
	if err != nil {
		return nil, err
	}
	region := o.Region
	if region == "" {
		region = os.Getenv("AWS_REGION")
	}
	if region == "" {
		region = os.Getenv("AWS_DEFAULT_REGION")
	}
	h := ep.Hostname()
	aws := h == "s3.amazonaws.com" || strings.HasSuffix(h, ".amazonaws.com")
	if region == "" && !aws {
		region = "us-east-1"
	}
	secure := ep.Scheme == "https"
	tr, err := minio.DefaultTransport(secure)
	if err != nil {
		return nil, err
	}
	s := &S3{bucket: bucket, prefix: prefix, endpoint: ep.String(), tr: tr}
	lookup := minio.BucketLookupPath
	if aws {
		lookup = minio.BucketLookupAuto
	}
	s.client, err = minio.New(ep.Host, &minio.Options{
		Creds:        creds,
		Secure:       secure,
		Region:       region,
		BucketLookup: lookup,
		Transport:    &countingTransport{base: tr, c: &s.counter},
	})
	if err != nil {
		return nil, fmt.Errorf("s3 client for %s: %w", s, err)
	}
	// A listing of one key, not a HEAD of the bucket: its answer has a
	// body that says what is wrong.
	for obj := range s.client.ListObjectsIter(ctx, bucket, minio.ListObjectsOptions{Prefix: s.base(), Recursive: true, MaxKeys: 1}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("open %s (credentials from %s): %w", s, source, s.fail(ctx, obj.Err))
		}
		break
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s, nil
}

// ParseS3URL splits "s3://BUCKET[/PREFIX]" into a bucket name that
// follows S3's rules and a prefix that is "" or a ValidKey (a trailing
// slash is dropped).
func ParseS3URL(raw string) (bucket, prefix string, err error) {
	rest, ok := strings.CutPrefix(raw, "s3://")
	if !ok {
		return "", "", fmt.Errorf("object store URL %q is not s3://BUCKET/PREFIX: %w", raw, errdefs.ErrInvalidArgument)
	}
	bucket, prefix, _ = strings.Cut(rest, "/")
	if !validBucketName(bucket) {
		return "", "", fmt.Errorf("object store URL %q: bucket name %q is not 3 to 63 lowercase letters, digits, dots and hyphens: %w", raw, bucket, errdefs.ErrInvalidArgument)
	}
	prefix = strings.TrimSuffix(prefix, "/")
	if prefix != "" && (!ValidKey(prefix) || len(prefix) > maxPrefix) {
		return "", "", fmt.Errorf("object store URL %q: prefix %q is not a clean relative path of at most %d bytes: %w", raw, prefix, maxPrefix, errdefs.ErrInvalidArgument)
	}
	return bucket, prefix, nil
}

// validBucketName follows S3's naming rules for new buckets.
func validBucketName(b string) bool {
	if len(b) < 3 || len(b) > 63 || strings.Contains(b, "..") {
		return false
	}
	for i, c := range []byte(b) {
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || i == len(b)-1 || c != '.' && c != '-') {
			return false
		}
	}
	return true
}

func parseEndpoint(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("s3 endpoint %q is not an http:// or https:// URL of a host: %w", raw, errdefs.ErrInvalidArgument)
	}
	u.Path = ""
	return u, nil
}

func (s *S3) String() string {
	return "s3://" + s.bucket + "/" + s.prefix + " at " + s.endpoint
}

// GoString keeps %#v from printing the client and its credentials.
func (s *S3) GoString() string { return s.String() }

// base is what the keys' names begin with: "" or "PREFIX/".
func (s *S3) base() string {
	if s.prefix == "" {
		return ""
	}
	return s.prefix + "/"
}

func (s *S3) name(key string) (string, error) {
	if !ValidKey(key) {
		return "", badKey(key)
	}
	if s.prefix == "" {
		return key, nil
	}
	return s.prefix + "/" + key, nil
}

// fail gives err its kind: a missing object is fs.ErrNotExist, a
// missing bucket ErrNotFound, an unknown key or a wrong signature
// ErrUnauthenticated, a refusal ErrPermissionDenied, a server error or
// an unreachable server ErrUnavailable; a cancelled ctx is ctx.Err().
//
// Only the code NoSuchKey is a missing object, not any 404: versitygw
// answers 404 XAdminUserNotFound to an unknown access key. A HEAD
// (Stat) has no body to tell, and minio-go calls its 404 NoSuchKey.
func (s *S3) fail(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	var r minio.ErrorResponse
	if !errors.As(err, &r) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable)
	}
	var kind error
	switch r.Code {
	case minio.NoSuchKey:
		kind = fs.ErrNotExist
	case minio.NoSuchBucket:
		kind = errdefs.ErrNotFound
	case minio.InvalidAccessKeyID, minio.SignatureDoesNotMatch, "XAdminUserNotFound":
		kind = errdefs.ErrUnauthenticated
	default:
		switch {
		case r.StatusCode == http.StatusForbidden:
			kind = errdefs.ErrPermissionDenied
		case r.StatusCode >= 500:
			kind = errdefs.ErrUnavailable
		default:
			return err
		}
	}
	return fmt.Errorf("%w: %w", err, kind)
}

func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	name, err := s.name(key)
	if err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("put %s: size %d: %w", key, size, errdefs.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	er := &exactReader{ctx: ctx, r: r, left: size}
	if size == 0 {
		// The request of an empty object may not read its body.
		if err := er.probe(); err != nil {
			return fmt.Errorf("put %s: %w", key, err)
		}
	}
	_, err = s.client.PutObject(ctx, s.bucket, name, er, size, minio.PutObjectOptions{PartSize: s3PartSize})
	if er.err != nil {
		// The reader's fault, or ctx's end: the request was cut short
		// before its last byte, so the server stored nothing.
		return fmt.Errorf("put %s: %w", key, er.err)
	}
	if err != nil {
		return fmt.Errorf("put %s to %s: %w", key, s, s.fail(ctx, err))
	}
	if er.left != 0 || !er.probed {
		return fmt.Errorf("put %s: %d of %d bytes sent", key, size-er.left, size)
	}
	return nil
}

// errShort and errLong end an upload whose reader does not hold the
// size it was given: not io.ErrUnexpectedEOF, which minio-go takes for
// the end of a part.
var (
	errShort = errors.New("reader ended before the given size")
	errLong  = errors.New("reader holds more than the given size")
)

// exactReader yields the left bytes of r, and fails the read that
// would deliver the last of them if r holds more, or once ctx is done:
// an upload must fail before its request is complete, not after (the
// server would keep the object).
type exactReader struct {
	ctx    context.Context
	r      io.Reader
	left   int64
	probed bool
	err    error
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.err == nil {
		e.err = e.ctx.Err()
	}
	if e.err != nil {
		return 0, e.err
	}
	if e.left == 0 {
		if err := e.probe(); err != nil {
			return 0, err
		}
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	if int64(n) == e.left {
		if err := e.probe(); err != nil {
			return 0, err
		}
		if e.err = e.ctx.Err(); e.err != nil {
			return 0, e.err
		}
		e.left = 0
		return n, nil
	}
	e.left -= int64(n)
	switch {
	case err == io.EOF:
		e.err = errShort
	case err != nil:
		e.err = err
	}
	return n, e.err
}

// probe reads one byte past the end: there must be none.
func (e *exactReader) probe() error {
	if e.probed {
		return e.err
	}
	e.probed = true
	var one [1]byte
	k, err := io.ReadFull(e.r, one[:])
	switch {
	case k > 0:
		e.err = errLong
	case err != io.EOF:
		e.err = err
	}
	return e.err
}

func (s *S3) Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	name, err := s.name(key)
	if err != nil {
		return nil, err
	}
	if off < 0 {
		return nil, fmt.Errorf("get %s: offset %d: %w", key, off, errdefs.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if length == 0 {
		return s.getEmpty(ctx, key, off, 0)
	}
	var o minio.GetObjectOptions
	ranged := off > 0 || length > 0
	if ranged {
		end := int64(0)
		if length > 0 {
			end = off + length - 1
		}
		if err := o.SetRange(off, end); err != nil {
			return nil, fmt.Errorf("get %s: %w: %w", key, err, errdefs.ErrInvalidArgument)
		}
	}
	body, info, h, err := minio.Core{Client: s.client}.GetObject(ctx, s.bucket, name, o)
	if err != nil {
		var r minio.ErrorResponse
		if errors.As(err, &r) && r.StatusCode == http.StatusRequestedRangeNotSatisfiable {
			return s.getEmpty(ctx, key, off, length)
		}
		return nil, fmt.Errorf("get %s from %s: %w", key, s, s.fail(ctx, err))
	}
	n := info.Size
	if n < 0 {
		body.Close()
		return nil, fmt.Errorf("get %s from %s: the answer has no Content-Length: %w", key, s, errdefs.ErrUnavailable)
	}
	total := n
	if ranged {
		first, last, size, ok := parseContentRange(h.Get("Content-Range"))
		if !ok || first != off || last-first+1 != n {
			body.Close()
			return nil, fmt.Errorf("get %s from %s: asked for bytes from %d, the server answered range %q of %d bytes: %w", key, s, off, h.Get("Content-Range"), n, errdefs.ErrUnavailable)
		}
		total = size
	}
	if (length > 0 && n != length) || (length < 0 && off+n != total) {
		body.Close()
		return nil, fmt.Errorf("get %s: bytes %d+%d beyond its %d", key, off, length, total)
	}
	return body, nil
}

// getEmpty answers a read of length (0, or to the end) bytes at off
// that the server refused as out of range: it is empty if off is the
// object's end.
func (s *S3) getEmpty(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	size, err := s.Stat(ctx, key)
	if err != nil {
		return nil, err
	}
	if length > 0 || off > size {
		return nil, fmt.Errorf("get %s: bytes %d+%d beyond its %d", key, off, length, size)
	}
	return io.NopCloser(strings.NewReader("")), nil
}

// parseContentRange reads "bytes FIRST-LAST/SIZE".
func parseContentRange(v string) (first, last, size int64, ok bool) {
	r, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return 0, 0, 0, false
	}
	span, sz, ok1 := strings.Cut(r, "/")
	a, b, ok2 := strings.Cut(span, "-")
	var e1, e2, e3 error
	first, e1 = strconv.ParseInt(a, 10, 64)
	last, e2 = strconv.ParseInt(b, 10, 64)
	size, e3 = strconv.ParseInt(sz, 10, 64)
	if !ok1 || !ok2 || e1 != nil || e2 != nil || e3 != nil || first < 0 || last < first || last >= size {
		return 0, 0, 0, false
	}
	return first, last, size, true
}

func (s *S3) Stat(ctx context.Context, key string) (int64, error) {
	name, err := s.name(key)
	if err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	info, err := s.client.StatObject(ctx, s.bucket, name, minio.StatObjectOptions{})
	if err != nil {
		return 0, fmt.Errorf("stat %s in %s: %w", key, s, s.fail(ctx, err))
	}
	if info.Size < 0 {
		return 0, fmt.Errorf("stat %s in %s: size %d: %w", key, s, info.Size, errdefs.ErrUnavailable)
	}
	return info.Size, nil
}

func (s *S3) List(ctx context.Context, prefix string) ([]string, error) {
	if len(prefix) > MaxKey || strings.ContainsFunc(prefix, func(c rune) bool { return c <= ' ' || c >= 0x7f || c == '\\' }) {
		return nil, fmt.Errorf("list prefix %q: %w", prefix, errdefs.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	base := s.base()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var keys []string
	for obj := range s.client.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{Prefix: base + prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("list %s in %s: %w", prefix, s, s.fail(ctx, obj.Err))
		}
		k, ok := strings.CutPrefix(obj.Key, base)
		if !ok || !strings.HasPrefix(k, prefix) {
			return nil, fmt.Errorf("list %s in %s: the server listed %q, outside the prefix: %w", prefix, s, obj.Key, errdefs.ErrUnavailable)
		}
		if !ValidKey(k) {
			// Not one of ours: no Bucket method can name it.
			continue
		}
		if len(keys) == maxListKeys {
			return nil, fmt.Errorf("list %s in %s: more than %d keys: %w", prefix, s, maxListKeys, errdefs.ErrResourceExhausted)
		}
		keys = append(keys, k)
	}
	// The listing stops quietly when ctx ends.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

func (s *S3) Delete(ctx context.Context, key string) error {
	name, err := s.name(key)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.client.RemoveObject(ctx, s.bucket, name, minio.RemoveObjectOptions{}); err != nil {
		err = s.fail(ctx, err)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("delete %s in %s: %w", key, s, err)
	}
	return nil
}

// CloseIdleConnections closes the connections to the server no request
// uses: a user of the bucket that stops (a daemon) leaves none open (an
// S3 server shutting down waits for connections that never sent a
// request).
func (s *S3) CloseIdleConnections() { s.tr.CloseIdleConnections() }

// countingTransport counts a bucket's requests and the bytes of their
// bodies.
type countingTransport struct {
	base http.RoundTripper
	c    *counter
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.c.requests.Add(1)
	if req.Body != nil && req.Body != http.NoBody && req.ContentLength > 0 {
		req = req.Clone(req.Context())
		req.Body = countingReader{ReadCloser: req.Body, n: &t.c.sent}
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = countingReader{ReadCloser: resp.Body, n: &t.c.received}
	return resp, nil
}
