package objstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/molt-sh/molt/internal/errdefs"
)

// credEnv clears what s3Creds reads, with HOME an empty directory.
func credEnv(t *testing.T) string {
	home := t.TempDir()
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE", "AWS_CONFIG_FILE"} {
		t.Setenv(k, "")
	}
	t.Setenv("HOME", home)
	return home
}

func wantCreds(t *testing.T, o S3Options, id, secret, token, source string) {
	t.Helper()
	c, src, err := s3Creds(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.GetWithContext(&credentials.CredContext{Context: t.Context()})
	if err != nil {
		t.Fatal(err)
	}
	if v.AccessKeyID != id || v.SecretAccessKey != secret || v.SessionToken != token {
		t.Errorf("credentials %q %q %q, want %q %q %q", v.AccessKeyID, v.SecretAccessKey, v.SessionToken, id, secret, token)
	}
	if !strings.Contains(src, source) {
		t.Errorf("source %q, want %q", src, source)
	}
}

const credFile = `[default]
aws_access_key_id = DEFAULTKEY
aws_secret_access_key = defaultsecret

[other]
aws_access_key_id = OTHERKEY
aws_secret_access_key = othersecret
aws_session_token = othertoken

[half]
aws_access_key_id = HALFKEY
`

func TestS3CredsEnvironment(t *testing.T) {
	home := credEnv(t)
	writeFile(t, filepath.Join(home, ".aws", "credentials"), credFile)
	t.Setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
	t.Setenv("AWS_SESSION_TOKEN", "envtoken")
	// The environment comes before the file.
	wantCreds(t, S3Options{}, "ENVKEY", "envsecret", "envtoken", "environment")
	// The options come before both.
	wantCreds(t, S3Options{Creds: &Credentials{AccessKey: "OPT", SecretKey: "optsecret"}}, "OPT", "optsecret", "", "options")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	if _, _, err := s3Creds(t.Context(), S3Options{}); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "only one") {
		t.Errorf("half the key pair in the environment: %v", err)
	}
	if _, _, err := s3Creds(t.Context(), S3Options{Creds: &Credentials{AccessKey: "OPT"}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("options without a secret: %v", err)
	}
}

func TestS3CredsSharedFile(t *testing.T) {
	home := credEnv(t)
	writeFile(t, filepath.Join(home, ".aws", "credentials"), credFile)
	wantCreds(t, S3Options{}, "DEFAULTKEY", "defaultsecret", "", `profile "default" of `+filepath.Join(home, ".aws", "credentials"))
	t.Setenv("AWS_PROFILE", "other")
	wantCreds(t, S3Options{}, "OTHERKEY", "othersecret", "othertoken", `profile "other"`)

	// AWS_SHARED_CREDENTIALS_FILE replaces ~/.aws/credentials.
	elsewhere := filepath.Join(t.TempDir(), "creds")
	writeFile(t, elsewhere, "[other]\naws_access_key_id = FILEKEY\naws_secret_access_key = filesecret\n")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", elsewhere)
	wantCreds(t, S3Options{}, "FILEKEY", "filesecret", "", elsewhere)

	for _, profile := range []string{"missing", "half"} {
		t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "")
		t.Setenv("AWS_PROFILE", profile)
		if _, _, err := s3Creds(t.Context(), S3Options{}); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), profile) {
			t.Errorf("profile %s: %v", profile, err)
		}
	}
}

func TestS3CredsNone(t *testing.T) {
	credEnv(t)
	_, _, err := s3Creds(t.Context(), S3Options{})
	if !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
		t.Fatalf("no credentials: %v", err)
	}
	// OpenS3 says so before any request (the port is closed).
	_, err = OpenS3(context.Background(), "s3://bucket/p", S3Options{Endpoint: "http://127.0.0.1:1"})
	if !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("open without credentials: %v", err)
	}
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestParseS3URL(t *testing.T) {
	for raw, want := range map[string][2]string{
		"s3://bucket":              {"bucket", ""},
		"s3://bucket/":             {"bucket", ""},
		"s3://my.bucket-1/a/b":     {"my.bucket-1", "a/b"},
		"s3://bucket/checkpoints/": {"bucket", "checkpoints"},
	} {
		b, p, err := ParseS3URL(raw)
		if err != nil || b != want[0] || p != want[1] {
			t.Errorf("ParseS3URL(%q) = %q, %q, %v; want %q", raw, b, p, err, want)
		}
	}
	for _, raw := range []string{
		"", "bucket/x", "http://bucket/x", "s3://", "s3://ab", "s3://Bucket", "s3://-bucket", "s3://bucket-", "s3://bu..cket",
		"s3://bu_cket", "s3://" + strings.Repeat("b", 64), "s3://bucket/../x", "s3://bucket//x", "s3://bucket/a//b",
		"s3://bucket/a/./b", "s3://bucket/a/..", "s3://bucket/a b", "s3://bucket/a\x00", "s3://bucket/" + strings.Repeat("p", 300),
	} {
		if b, p, err := ParseS3URL(raw); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseS3URL(%q) = %q, %q, %v; want ErrInvalidArgument", raw, b, p, err)
		}
	}
}

func TestS3Endpoint(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "K")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "S")
	for _, ep := range []string{"127.0.0.1:9000", "ftp://host", "http://", "http://host/path", "http://u:p@host", "http://host?x=1"} {
		if _, err := OpenS3(context.Background(), "s3://bucket", S3Options{Endpoint: ep}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("endpoint %q: %v", ep, err)
		}
	}
	// An endpoint nobody serves: an error, ErrUnavailable.
	ctx, cancel := context.WithTimeout(context.Background(), 30e9)
	defer cancel()
	if _, err := OpenS3(ctx, "s3://bucket", S3Options{Endpoint: "http://127.0.0.1:1"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("closed port: %v", err)
	}
}
