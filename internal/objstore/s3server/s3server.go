// Package s3server runs a real S3-compatible server for tests and
// benchmarks: versitygw (the Versity S3 Gateway) with its posix backend,
// built from the Go module proxy by scripts/s3server.sh, on a free
// loopback port, over a data directory of its own, with random root
// credentials that it checks (SigV4). Nothing here is a mock: the
// requests go over HTTP to the server process (docs/storage.md, "The S3
// server of the tests").
//
// StartProcess starts one, which the caller must Stop; package s3test
// wraps it for tests.
package s3server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/molt-sh/molt/internal/objstore"
)

// Version is the versitygw release scripts/s3server.sh builds.
const Version = "v1.8.0"

// BuildCommand builds the server (what `make deps` runs).
const BuildCommand = "scripts/s3server.sh"

// Binary returns the path of the server's binary: $MOLT_S3_SERVER, or
// where scripts/s3server.sh puts it ($MOLT_S3_CACHE, by default
// /var/cache/molt/s3). It is an error (fs.ErrNotExist) if it is not
// there.
func Binary() (string, error) {
	p := os.Getenv("MOLT_S3_SERVER")
	if p == "" {
		cache := os.Getenv("MOLT_S3_CACHE")
		if cache == "" {
			cache = "/var/cache/molt/s3"
		}
		p = filepath.Join(cache, "versitygw-"+Version, "bin", "versitygw")
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("the S3 server of the tests: %w", err)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("the S3 server of the tests: %s is not an executable file", p)
	}
	return p, nil
}

// Server is a running S3-compatible server with one bucket.
type Server struct {
	// Endpoint is http://127.0.0.1:PORT.
	Endpoint string
	// Bucket exists, empty at the start.
	Bucket    string
	AccessKey string
	SecretKey string
	// Region is the one the server signs for.
	Region string
}

// URL is the s3:// URL of prefix ("" for the bucket's root) in the
// bucket.
func (s Server) URL(prefix string) string {
	return "s3://" + s.Bucket + "/" + prefix
}

// Options are the S3Options that reach the server with its root
// credentials.
func (s Server) Options() objstore.S3Options {
	return objstore.S3Options{
		Endpoint: s.Endpoint,
		Region:   s.Region,
		Creds:    &objstore.Credentials{AccessKey: s.AccessKey, SecretKey: s.SecretKey},
	}
}

// Open opens the bucket under prefix.
func (s Server) Open(ctx context.Context, prefix string) (*objstore.S3, error) {
	return objstore.OpenS3(ctx, s.URL(prefix), s.Options())
}

// Process is a server process started by StartProcess.
type Process struct {
	Server
	// Log is the file of the server's stdout and stderr.
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // cmd.Wait's, once done is closed
}

// StartProcess starts the server with its data in dir (created; its
// log is dir/server.log), creates bucket "molt", and returns once the
// bucket answers. The caller must Stop it. A port taken between its
// choice and the server's bind is retried with another.
func StartProcess(ctx context.Context, dir string) (*Process, error) {
	bin, err := Binary()
	if err != nil {
		return nil, fmt.Errorf("%w (build it with %s)", err, BuildCommand)
	}
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		p, err := start(ctx, bin, dir, data)
		if err == nil || attempt == 2 || !errors.Is(err, errExited) {
			return p, err
		}
	}
}

var errExited = errors.New("the S3 server exited")

func start(ctx context.Context, bin, dir, data string) (*Process, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p := &Process{
		Server: Server{
			Endpoint:  "http://127.0.0.1:" + strconv.Itoa(port),
			Bucket:    "molt",
			AccessKey: "molt" + randHex(8),
			SecretKey: randHex(20),
			Region:    "us-east-1",
		},
		Log:  filepath.Join(dir, "server.log"),
		done: make(chan struct{}),
	}
	log, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	p.cmd = exec.Command(bin, "--port", "127.0.0.1:"+strconv.Itoa(port), "--region", p.Region, "--quiet", "posix", data)
	// The keys go by the environment, not the command line that ps shows.
	p.cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+p.AccessKey, "ROOT_SECRET_ACCESS_KEY="+p.SecretKey)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	if err := p.ready(ctx); err != nil {
		_ = p.Stop()
		return nil, fmt.Errorf("%w; its log ends with:\n%s", err, p.LogTail(2048))
	}
	return p, nil
}

// ready waits until the server answers, then creates the bucket.
func (p *Process) ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		select {
		case <-p.done:
			return fmt.Errorf("%w at start: %v", errExited, p.err)
		case <-ctx.Done():
			return fmt.Errorf("the S3 server did not answer at %s: %w", p.Endpoint, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.Endpoint+"/", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			break
		}
	}
	c, err := minio.New(p.Endpoint[len("http://"):], &minio.Options{
		Creds:  credentials.NewStaticV4(p.AccessKey, p.SecretKey, ""),
		Region: p.Region,
	})
	if err != nil {
		return err
	}
	if err := c.MakeBucket(ctx, p.Bucket, minio.MakeBucketOptions{Region: p.Region}); err != nil {
		return fmt.Errorf("create bucket %s at %s: %w", p.Bucket, p.Endpoint, err)
	}
	return nil
}

// Stop ends the server (SIGTERM, SIGKILL after 20 s) and waits for it.
// It is an error if the server had exited by itself, or did not exit
// on SIGTERM. (versitygw waits up to 10 s for open connections, then
// exits: the bound is beyond that.)
func (p *Process) Stop() error {
	select {
	case <-p.done:
		return fmt.Errorf("%w before it was stopped: %v", errExited, p.err)
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(20 * time.Second):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	return errors.New("the S3 server did not exit on SIGTERM within 20 s")
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// LogTail returns the last n bytes of the server's log.
func (p *Process) LogTail(n int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
