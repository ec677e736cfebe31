package ckstore

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// FuzzDecodeManifest: a manifest DecodeManifest accepts names only
// single path components and objects inside the checkpoint's directory
// (each with a size and a well-formed hash, which verify slices), is
// written back by encoding/json and read the same, and is refused once
// anything follows it.
func FuzzDecodeManifest(f *testing.F) {
	// Seeds: testdata/fuzz/FuzzDecodeManifest (manifests as Writer.Commit
	// writes them, and broken ones).
	f.Fuzz(func(t *testing.T, b []byte) {
		mf, err := DecodeManifest(b)
		if err != nil {
			return
		}
		for _, id := range []string{mf.ID, mf.Sandbox, mf.Parent} {
			if strings.ContainsAny(id, "/\x00") || id == "." || id == ".." {
				t.Fatalf("accepted ID %q", id)
			}
		}
		for _, o := range mf.Objects {
			if p := filepath.Join("/ck", o.Path); !strings.HasPrefix(p, "/ck/") {
				t.Fatalf("accepted object path %q, which leads to %s", o.Path, p)
			}
			if len(o.SHA256) < 12 || o.Size < 0 {
				t.Fatalf("accepted object %+v", o)
			}
		}
		if _, err := DecodeManifest(append(bytes.Clone(b), " {}"...)); err == nil {
			t.Fatalf("accepted %q followed by another value", b)
		}
		out, err := json.MarshalIndent(mf, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeManifest(out)
		if err != nil {
			t.Fatalf("%s accepted, its encoding refused: %v", b, err)
		}
		if !reflect.DeepEqual(normal(mf), normal(again)) {
			t.Fatalf("round trip changed %+v to %+v", mf, again)
		}
	})
}

// normal drops what JSON does not keep: an empty list and time's
// monotonic reading and location.
func normal(mf Manifest) Manifest {
	if len(mf.Objects) == 0 {
		mf.Objects = nil
	}
	mf.Created = mf.Created.UTC()
	return mf
}

func TestDecodeManifest(t *testing.T) {
	good := Manifest{Format: 1, ID: "3fa2b1c4d5e6", Sandbox: "9e8d7c6b5a41", Parent: "0a1b2c3d4e5f", Kind: "full",
		Image: "debian", Molt: "dev", Kernel: "6.18", Arch: "amd64",
		Objects: []Object{{Path: "images/core-1.img", Size: 5, SHA256: strings.Repeat("ab", 32)}}}
	enc := func(mf Manifest) []byte {
		b, err := json.MarshalIndent(mf, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := DecodeManifest(enc(good)); err != nil {
		t.Fatalf("a manifest as Writer.Commit writes it: %v", err)
	}
	for name, bad := range map[string]func(*Manifest){
		"newer format":     func(m *Manifest) { m.Format = 2 },
		"ID with a slash":  func(m *Manifest) { m.ID = "../x" },
		"empty sandbox":    func(m *Manifest) { m.Sandbox = "" },
		"parent dot-dot":   func(m *Manifest) { m.Parent = ".." },
		"unknown kind":     func(m *Manifest) { m.Kind = "auto" },
		"fs with objects":  func(m *Manifest) { m.Kind = "fs" },
		"object outside":   func(m *Manifest) { m.Objects[0].Path = "../../etc/shadow" },
		"object absolute":  func(m *Manifest) { m.Objects[0].Path = "/etc/shadow" },
		"object not clean": func(m *Manifest) { m.Objects[0].Path = "images//core-1.img" },
		"object the dir":   func(m *Manifest) { m.Objects[0].Path = "." },
		"short hash":       func(m *Manifest) { m.Objects[0].SHA256 = "ab" },
		"uppercase hash":   func(m *Manifest) { m.Objects[0].SHA256 = strings.Repeat("AB", 32) },
		"negative size":    func(m *Manifest) { m.Objects[0].Size = -1 },
	} {
		mf := good
		mf.Objects = append([]Object(nil), good.Objects...)
		bad(&mf)
		if _, err := DecodeManifest(enc(mf)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := DecodeManifest(append(enc(good), "\n{}"...)); err == nil {
		t.Errorf("a manifest followed by another value: accepted")
	}
}
