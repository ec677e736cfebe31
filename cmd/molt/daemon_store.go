package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/molt-sh/molt/internal/keys"
	"github.com/molt-sh/molt/internal/objstore"
	"github.com/molt-sh/molt/internal/remote"
	"github.com/spf13/cobra"
)

// storeFlags give the object store checkpoints are uploaded to
// (docs/storage.md), and what sets daemons sharing a machine apart.
type storeFlags struct {
	url, endpoint, region string
	cache                 sizeFlag
	cgroupParent          string
	lazy                  bool
	gcEvery, gcGrace      time.Duration
}

func (f *storeFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&f.url, "store", "", "object store for checkpoints: s3://BUCKET/PREFIX (any S3-compatible server; credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws/credentials) or file:///DIR; committed checkpoints are uploaded in the background, hibernate --offload frees local copies, and a daemon sharing the store resumes them (docs/storage.md)")
	c.Flags().StringVar(&f.endpoint, "store-endpoint", "", "URL of the S3-compatible server of --store (default Amazon S3)")
	c.Flags().StringVar(&f.region, "store-region", "", "region --store's requests are signed for (default AWS_REGION, else us-east-1)")
	c.Flags().StringVar(&f.cgroupParent, "cgroup-parent", "molt", "cgroup (in every hierarchy) the sandboxes' cgroups are made in; daemons sharing a machine need their own")
	c.Flags().BoolVar(&f.lazy, "lazy-resume", true, "a resume from the --store restores as soon as the process images and the pages CRIU reads itself are here, and brings the rest of the memory on demand (CRIU's lazy-pages daemon, userfaultfd), each page checked against its hash; a resume from the local pool of 64 MiB of pages or more runs its tree before its memory is in too; false fetches and checks every page first, and restores every page before the tree runs")
	c.Flags().DurationVar(&f.gcEvery, "store-gc-every", 0, "run a garbage collection over --store this often (0: never; molt store gc runs one): packs and histories nothing names are deleted a grace period after a run first finds them so; let one daemon of those sharing a store do it")
	c.Flags().DurationVar(&f.gcGrace, "store-gc-grace", time.Hour, "how long --store-gc-every's runs keep what nothing names before deleting it (at least 1m; every upload must finish within it)")
	c.Flags().Var(&f.cache, "store-cache", "bound the local copies of checkpoints that are in --store to this size: the least recently used are freed and fetched back when a restore needs them (0: keep them all)")
}

// open opens the store, nil without --store.
func (f *storeFlags) open(ctx context.Context) (objstore.Bucket, error) {
	if f.gcEvery < 0 || f.gcGrace < remote.MinGCGrace {
		return nil, fmt.Errorf("--store-gc-every must not be negative, and --store-gc-grace at least %v", remote.MinGCGrace)
	}
	switch {
	case f.url == "":
		if f.endpoint != "" || f.region != "" || f.cache != 0 || f.gcEvery != 0 {
			return nil, fmt.Errorf("--store-endpoint, --store-region, --store-cache and --store-gc-every need --store")
		}
		return nil, nil
	case strings.HasPrefix(f.url, "s3://"):
		return objstore.OpenS3(ctx, f.url, objstore.S3Options{Endpoint: f.endpoint, Region: f.region})
	case strings.HasPrefix(f.url, "file://"):
		u, err := url.Parse(f.url)
		if err != nil || u.Host != "" || !strings.HasPrefix(u.Path, "/") {
			return nil, fmt.Errorf("--store %q: want file:///ABSOLUTE/DIR", f.url)
		}
		if f.endpoint != "" {
			return nil, fmt.Errorf("--store-endpoint is for an s3:// store")
		}
		return objstore.NewDir(u.Path)
	}
	return nil, fmt.Errorf("--store %q: want s3://BUCKET/PREFIX or file:///DIR", f.url)
}

// open returns the key-encryption keys (nil without --kek-file) and the
// store (nil without --store).
func (eg *egressFlags) open(ctx context.Context) (kek, previous keys.KEK, store objstore.Bucket, err error) {
	if kek, previous, err = eg.kek.load(); err != nil {
		return nil, nil, nil, err
	}
	store, err = eg.store.open(ctx)
	return kek, previous, store, err
}
