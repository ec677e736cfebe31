package core

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sandbox"
)

// TestManifestOfUnchanged: the manifest of a checkpoint record is, byte
// for byte, the one molt wrote before the artifact moved to
// internal/ckstore (its testdata/format1, made by that molt).
func TestManifestOfUnchanged(t *testing.T) {
	m := &Manager{kernel: "6.18.0-pvm"}
	m.cfg.Version = "v0.9.0"
	ck := checkpointRec{Checkpoint: meta.Checkpoint{
		ID: "3fa2b1c4d5e6", Sandbox: "9e8d7c6b5a41", Parent: "0a1b2c3d4e5f", Kind: v1.KindFull, Label: "before-tests",
		Created: time.Date(2026, 11, 30, 12, 1, 2, 345678901, time.UTC), StallMS: 41.25, DurationMS: 180.5,
		Keep: true, Capture: "template", CaptureNote: "no room", BytesWritten: 123456,
		StallParts: &meta.StallParts{SnapshotMS: 3.5, CRIUMS: 30.25},
	}, Image: "debian", CRIU: "4.2.1", ExternalNet: true, ExternalUTS: true, ExternalIPC: true,
		IDs: sandbox.IDRange{Base: 1 << 30, Size: 1 << 16},
		Objects: []ckstore.Object{
			{Path: "images/core-1.img", Size: 5, SHA256: strings.Repeat("ab", 32)},
			{Path: "images/pages-1.img", Size: 8192, SHA256: strings.Repeat("cd", 32)},
			{Path: "pagehash/pages-1.img", Size: 64, SHA256: strings.Repeat("ef", 32)},
		}}
	fs := ck
	fs.Kind, fs.Objects, fs.IDs, fs.CRIU, fs.StallParts = v1.KindFS, nil, sandbox.IDRange{}, "", nil
	for name, mf := range map[string]ckstore.Manifest{
		"full-committed":   m.manifestOf(ck, true),
		"full-uncommitted": m.manifestOf(ck, false),
		"fs":               m.manifestOf(fs, false),
	} {
		want, err := os.ReadFile("../ckstore/testdata/format1/" + name + ".json")
		if err != nil {
			t.Fatal(err)
		}
		got, err := mf.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: manifest\n%s\nwant\n%s", name, got, want)
		}
	}
}
