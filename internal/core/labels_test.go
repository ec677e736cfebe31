package core

import (
	"context"
	"errors"
	"slices"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
)

// Labels are per sandbox: a bare label two sandboxes carry is ambiguous
// for every command that names a checkpoint without a sandbox, and
// SANDBOX:LABEL names one.
func TestLabelsPerSandbox(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	mk := func(name string) meta.Sandbox {
		sb, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	a, b := mk("la"), mk("lb")
	ck := func(sb meta.Sandbox, label string) meta.Checkpoint {
		c, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS, Label: label})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	aBase, bBase := ck(a, "base"), ck(b, "base")
	aOnly := ck(a, "only")

	// Bare and shared: refused by delete, inspect, verify and fork,
	// with both candidates; nothing deleted.
	for name, op := range map[string]func() error{
		"delete":  func() error { return m.DeleteCheckpoint(ctx, "base") },
		"inspect": func() error { _, err := m.CheckpointInfo("base"); return err },
		"verify":  func() error { _, err := m.VerifyCheckpoint("base"); return err },
		"fork":    func() error { _, err := m.Fork(ctx, "base", v1.ForkRequest{N: 1}); return err },
	} {
		err := op()
		var amb *errdefs.AmbiguousError
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.As(err, &amb) {
			t.Fatalf("%s base: %v, want an ambiguous-reference error", name, err)
		}
		if want := []string{"la:base", "lb:base"}; !slices.Equal(amb.Candidates, want) {
			t.Fatalf("%s base: candidates %v, want %v", name, amb.Candidates, want)
		}
	}
	for _, id := range []string{aBase.ID, bBase.ID} {
		if _, err := m.CheckpointInfo(id); err != nil {
			t.Fatalf("checkpoint %s gone after refused deletes: %v", id, err)
		}
	}

	// A label only one sandbox carries still resolves bare.
	if got, err := m.CheckpointInfo("only"); err != nil || got.ID != aOnly.ID {
		t.Fatalf("inspect only = %s, %v; want %s", got.ID, err, aOnly.ID)
	}
	// A rollback names its sandbox: its own label wins.
	if _, err := m.Rollback(ctx, b.ID, "base"); err != nil {
		t.Fatal(err)
	}
	if got := m.headOf(t, b.ID); got != bBase.ID {
		t.Fatalf("b's head after rollback to base = %s, want %s", got, bBase.ID)
	}
	// SANDBOX:LABEL addresses one; another sandbox's label is not found
	// through a sandbox that lacks it.
	if got, err := m.CheckpointInfo("lb:base"); err != nil || got.ID != bBase.ID {
		t.Fatalf("inspect lb:base = %s, %v; want %s", got.ID, err, bBase.ID)
	}
	if _, err := m.CheckpointInfo("lb:only"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("inspect lb:only: %v, want not found", err)
	}
	if _, err := m.CheckpointInfo(b.ID + ":" + aOnly.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("inspect SB:ID of another sandbox's checkpoint: %v, want not found", err)
	}
	for _, bad := range []string{":base", "la:", "nosuch:base"} {
		if _, err := m.CheckpointInfo(bad); err == nil {
			t.Fatalf("inspect %q resolved", bad)
		}
	}
	if err := m.DeleteCheckpoint(ctx, "la:base"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CheckpointInfo(aBase.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("la:base still there after delete: %v", err)
	}
	if _, err := m.CheckpointInfo(bBase.ID); err != nil {
		t.Fatalf("lb:base deleted with la:base: %v", err)
	}
	// With one sandbox left carrying it, the bare label resolves again.
	if got, err := m.CheckpointInfo("base"); err != nil || got.ID != bBase.ID {
		t.Fatalf("inspect base = %s, %v; want %s", got.ID, err, bBase.ID)
	}
}

func (m *Manager) headOf(t *testing.T, id string) string {
	t.Helper()
	sb, err := m.Sandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.Head
}
