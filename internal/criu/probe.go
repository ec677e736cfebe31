package criu

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"
)

// MinVersion is the oldest CRIU molt supports: 4.1 cannot dump a process
// holding a TCP or UDP socket on kernels >= 6.16.
const MinVersion = "4.2"

const minVersionCode = 40200 // major*10000 + minor*100 + sublevel

// Features is what CRIU can do on this host (for `molt host`).
type Features struct {
	Version     string // e.g. "4.2.1"; "" when CRIU did not answer
	VersionOK   bool   // Version >= MinVersion
	Check       bool   // `criu check` passed
	CheckOutput string // its output (or why it could not run) when it failed
	LazyPages   bool   // lazy restore usable: userfaultfd with non-cooperative events (`criu check --feature uffd-noncoop`)
	DirtyTrack  bool   // soft-dirty memory tracking (`criu check --feature mem_dirty_track`)
	SelfTest    error  // nil when the self-test passed
	SelfTestMS  float64

	// KerndatCache is the file CRIU loads its kernel probe from, or ""
	// when it probes the kernel again on every call (see CacheKerndat).
	KerndatCache string
}

// Probe runs the probes once and memoizes the result; later calls return
// the same Features at once. The self-test runs with SelfTestTimeout
// unless ctx ends earlier. A probe that ctx cut short is not memoized.
func (t *Tool) Probe(ctx context.Context) Features {
	t.probeMu.Lock()
	defer t.probeMu.Unlock()
	if t.probed != nil {
		return *t.probed
	}
	f := t.probe(ctx)
	if ctx.Err() == nil {
		t.probed = &f
	}
	return f
}

func (t *Tool) probe(ctx context.Context) Features {
	var f Features
	fs, err := t.features(ctx)
	if err != nil {
		f.CheckOutput = err.Error()
		f.SelfTest = err
		return f
	}
	f.Version = fs.version
	f.VersionOK = fs.code >= minVersionCode
	f.LazyPages = fs.lazyPages
	f.DirtyTrack = fs.dirtyTrack

	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	out, err := exec.CommandContext(cctx, t.path, "check").CombinedOutput()
	cancel()
	f.Check = err == nil
	if err != nil {
		f.CheckOutput = strings.TrimSpace(string(out))
		if f.CheckOutput == "" {
			f.CheckOutput = err.Error()
		}
	}

	start := time.Now()
	f.SelfTest = t.SelfTest(ctx)
	f.SelfTestMS = ms(time.Since(start))
	f.KerndatCache = t.kerndatCache()
	return f
}

// featureSet is CRIU's answer to the VERSION and FEATURE_CHECK requests.
type featureSet struct {
	version    string
	code       int // major*10000 + minor*100 + sublevel
	lazyPages  bool
	lazyReason string // why lazyPages is false
	dirtyTrack bool
}

// features asks CRIU for its version and features, once per Tool (an
// answer that ctx cut short is not kept).
func (t *Tool) features(ctx context.Context) (*featureSet, error) {
	t.featMu.Lock()
	defer t.featMu.Unlock()
	if t.feat != nil {
		return t.feat, nil
	}
	// CRIU keeps a session open after a feature check, not after a
	// version request in every release: ask in this order.
	reqs := []*rpc.CriuReq{
		{Type: rpc.CriuReqType_FEATURE_CHECK.Enum(), KeepOpen: proto.Bool(true), Features: &rpc.CriuFeatures{
			LazyPages: proto.Bool(true),
			MemTrack:  proto.Bool(true),
		}},
		{Type: rpc.CriuReqType_VERSION.Enum()},
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resps, err := t.call(cctx, "probe", reqs, nil, nil, "", nil, nil)
	if err != nil {
		return nil, err
	}
	if len(resps) != 2 || !resps[0].GetSuccess() || !resps[1].GetSuccess() {
		last := resps[len(resps)-1]
		return nil, &Error{Op: "probe", Cause: last.GetCrErrmsg(), Err: errors.New("CRIU refused the version or feature request")}
	}
	v := resps[1].GetVersion()
	fs := &featureSet{
		version: fmt.Sprintf("%d.%d", v.GetMajorNumber(), v.GetMinorNumber()),
		code:    int(v.GetMajorNumber()*10000 + v.GetMinorNumber()*100 + v.GetSublevel()),
	}
	if v.GetSublevel() != 0 {
		fs.version += fmt.Sprintf(".%d", v.GetSublevel())
	}
	if g := v.GetGitid(); g != "" {
		fs.version += " (" + g + ")"
	}
	feat := resps[0].GetFeatures()
	fs.lazyPages = feat.GetLazyPages()
	fs.dirtyTrack = feat.GetMemTrack()
	if !fs.lazyPages {
		fs.lazyReason = "userfaultfd with non-cooperative events is not available"
	}
	t.feat = fs
	return fs, nil
}
