package objstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"

	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/molt-sh/molt/internal/errdefs"
)

// Credentials are an S3 access key pair, with a session token for
// temporary ones. They print as "[redacted]", whatever the verb.
type Credentials struct {
	AccessKey    string
	SecretKey    string
	SessionToken string
}

func (Credentials) String() string   { return "[redacted]" }
func (Credentials) GoString() string { return "[redacted]" }

// s3Creds finds the credentials of a bucket where the AWS tools look,
// in their order: o.Creds when given; AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN) from the environment;
// then the profile AWS_PROFILE (or "default") of the shared credentials
// file AWS_SHARED_CREDENTIALS_FILE (or ~/.aws/credentials). It returns
// them with where they came from, for messages. None is
// errdefs.ErrUnauthenticated: an anonymous request is never sent.
func s3Creds(ctx context.Context, o S3Options) (*credentials.Credentials, string, error) {
	if c := o.Creds; c != nil {
		if c.AccessKey == "" || c.SecretKey == "" {
			return nil, "", fmt.Errorf("s3 credentials given without an access key or a secret key: %w", errdefs.ErrInvalidArgument)
		}
		return credentials.NewStaticV4(c.AccessKey, c.SecretKey, c.SessionToken), "options", nil
	}
	id, secret := os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
	switch {
	case id != "" && secret != "":
		return credentials.NewStaticV4(id, secret, os.Getenv("AWS_SESSION_TOKEN")), "environment", nil
	case id != "" || secret != "":
		return nil, "", fmt.Errorf("only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set: %w", errdefs.ErrUnauthenticated)
	}
	file := os.Getenv("AWS_SHARED_CREDENTIALS_FILE")
	if file == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, "", fmt.Errorf("no S3 credentials: AWS_ACCESS_KEY_ID is not set, and no home directory for ~/.aws/credentials (%v): %w", err, errdefs.ErrUnauthenticated)
		}
		file = filepath.Join(home, ".aws", "credentials")
	}
	profile := os.Getenv("AWS_PROFILE")
	if profile == "" {
		profile = "default"
	}
	if _, err := os.Stat(file); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", fmt.Errorf("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or write profile %q in %s: %w", profile, file, errdefs.ErrUnauthenticated)
		}
		return nil, "", fmt.Errorf("s3 credentials file: %w", err)
	}
	creds := credentials.NewFileAWSCredentials(file, profile)
	v, err := creds.GetWithContext(&credentials.CredContext{Client: http.DefaultClient, Context: ctx})
	if err != nil {
		return nil, "", fmt.Errorf("s3 credentials: profile %q of %s: %v: %w", profile, file, err, errdefs.ErrUnauthenticated)
	}
	if v.AccessKeyID == "" || v.SecretAccessKey == "" {
		return nil, "", fmt.Errorf("s3 credentials: profile %q of %s has no aws_access_key_id and aws_secret_access_key: %w", profile, file, errdefs.ErrUnauthenticated)
	}
	return creds, fmt.Sprintf("profile %q of %s", profile, file), nil
}
