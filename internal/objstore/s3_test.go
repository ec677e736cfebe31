package objstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/objstore"
	"github.com/molt-sh/molt/internal/objstore/objstoretest"
	"github.com/molt-sh/molt/internal/objstore/s3test"
)

// TestS3Conformance runs the suite against S3 on a real server
// (versitygw), each subtest under a prefix of its own.
func TestS3Conformance(t *testing.T) {
	srv := s3test.Start(t)
	objstoretest.Run(t, func(t *testing.T) objstore.Bucket { return srv.OpenBucket(t, "") })
}

// TestS3Prefixes: the objects of one prefix are not seen from another
// nor from the root, where their keys carry the prefix.
func TestS3Prefixes(t *testing.T) {
	srv := s3test.Start(t)
	a, b := srv.OpenBucket(t, "a/p"), srv.OpenBucket(t, "a/q")
	root := srv.OpenBucket(t, "")
	rootOfBucket, err := srv.Open(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Put(t.Context(), "k", strings.NewReader("A"), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Stat(t.Context(), "k"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stat in another prefix: %v", err)
	}
	if keys, err := root.List(t.Context(), ""); err != nil || len(keys) != 0 {
		t.Errorf("list of a fresh prefix: %q, %v", keys, err)
	}
	if keys, err := rootOfBucket.List(t.Context(), "a/"); err != nil || fmt.Sprint(keys) != "[a/p/k]" {
		t.Errorf("list of the bucket's root: %q, %v", keys, err)
	}
	if n, err := rootOfBucket.Stat(t.Context(), "a/p/k"); err != nil || n != 1 {
		t.Errorf("stat from the root: %d, %v", n, err)
	}
}

// TestS3Credentials: the server checks signatures, so credentials that
// are wrong are refused at open; credentials come from the environment
// when the options have none; neither String nor %v nor %#v shows the
// secret.
func TestS3Credentials(t *testing.T) {
	srv := s3test.Start(t)
	o := srv.Options()
	o.Creds = &objstore.Credentials{AccessKey: srv.AccessKey, SecretKey: srv.SecretKey + "x"}
	if _, err := objstore.OpenS3(t.Context(), srv.URL(""), o); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("open with a wrong secret: %v, want ErrUnauthenticated", err)
	}
	o.Creds = &objstore.Credentials{AccessKey: "nobody", SecretKey: srv.SecretKey}
	if _, err := objstore.OpenS3(t.Context(), srv.URL(""), o); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("open with an unknown access key: %v, want ErrUnauthenticated", err)
	}

	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	o.Creds = nil
	b, err := objstore.OpenS3(t.Context(), srv.URL("env"), o)
	if err != nil {
		t.Fatalf("open with the environment's credentials: %v", err)
	}
	if err := b.Put(t.Context(), "k", strings.NewReader("v"), 1); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{b.String(), fmt.Sprintf("%v %+v %#v %s", b, b, b, b), fmt.Sprintf("%v %+v %#v", srv.Options(), srv.Options(), srv.Options())} {
		if strings.Contains(s, srv.SecretKey) || strings.Contains(s, srv.AccessKey) {
			t.Errorf("credentials printed: %s", s)
		}
	}
	if want := "s3://" + srv.Bucket + "/env at " + srv.Endpoint; b.String() != want {
		t.Errorf("String() = %q, want %q", b.String(), want)
	}

	if _, err := objstore.OpenS3(t.Context(), "s3://no-such-bucket/x", srv.Options()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("open of a missing bucket: %v, want ErrNotFound", err)
	}
}

// TestS3AbortedUploads: a multipart upload that fails (its reader is
// short, long or broken, or its context ends) is aborted, leaving no
// parts on the server; the bucket's traffic is counted per request.
func TestS3AbortedUploads(t *testing.T) {
	srv := s3test.Start(t)
	b := srv.OpenBucket(t, "")
	before := b.Stats()
	d := make([]byte, 40<<20)
	for _, c := range []struct {
		r    io.Reader
		size int64
	}{
		{struct{ io.Reader }{bytes.NewReader(d[:35<<20])}, 36 << 20},
		{struct{ io.Reader }{bytes.NewReader(d)}, 36 << 20},
		{io.MultiReader(bytes.NewReader(d[:20<<20]), iotest{}), 36 << 20},
	} {
		if err := b.Put(t.Context(), "big", c.r, c.size); err == nil {
			t.Fatal("put succeeded")
		}
	}
	c, err := minio.New(strings.TrimPrefix(srv.Endpoint, "http://"), &minio.Options{
		Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, ""), Region: srv.Region,
	})
	if err != nil {
		t.Fatal(err)
	}
	for u := range c.ListIncompleteUploads(t.Context(), srv.Bucket, "", true) {
		if u.Err != nil {
			t.Fatal(u.Err)
		}
		t.Errorf("upload %s of %s left behind", u.UploadID, u.Key)
	}
	// The listing would show one.
	if _, err := (minio.Core{Client: c}).NewMultipartUpload(t.Context(), srv.Bucket, "pending", minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for u := range c.ListIncompleteUploads(t.Context(), srv.Bucket, "", true) {
		if u.Err != nil || u.Key != "pending" {
			t.Errorf("incomplete upload %+v", u)
		}
		n++
	}
	if n != 1 {
		t.Errorf("%d incomplete uploads listed, want the one started", n)
	}
	// Each failed put: an initiate, the parts, an abort.
	s := b.Stats()
	if n := s.Requests - before.Requests; n < 9 {
		t.Errorf("%d requests counted for three failed multipart uploads", n)
	}
	if n := s.Sent - before.Sent; n < 3*16<<20 {
		t.Errorf("%d bytes sent counted for three failed multipart uploads", n)
	}
	if keys, err := b.List(t.Context(), ""); err != nil || len(keys) != 0 {
		t.Errorf("list: %q, %v", keys, err)
	}
}

type iotest struct{}

func (iotest) Read([]byte) (int, error) { return 0, errors.New("broken") }

// TestS3ListPaging: the server answers 1000 keys a page, and List
// follows the continuation tokens (the suite's ListPages checks the
// keys; this checks that paging happened).
func TestS3ListPaging(t *testing.T) {
	srv := s3test.Start(t)
	b := srv.OpenBucket(t, "")
	const n = 1001
	sem := make(chan struct{}, 16)
	errs := make(chan error, n)
	for i := range n {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			errs <- b.Put(t.Context(), fmt.Sprintf("k/%05d", i), strings.NewReader(""), 0)
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	before := b.Stats().Requests
	keys, err := b.List(t.Context(), "k/")
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != n || keys[0] != "k/00000" || keys[n-1] != fmt.Sprintf("k/%05d", n-1) {
		t.Fatalf("listed %d keys, want %d", len(keys), n)
	}
	if pages := b.Stats().Requests - before; pages != 2 {
		t.Errorf("%d requests to list %d keys, want 2 pages", pages, n)
	}
}
