package main

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestKeep_KeepsWhatAMeasurementFoundAndPassesOverOneThatFailed: a
// measurement's sample is logged and kept under its system and key; one
// that fails is logged and not kept, and the rounds go on; a failure once
// the context has ended ends them with the context's error.
func TestKeep_KeepsWhatAMeasurementFoundAndPassesOverOneThatFailed(t *testing.T) {
	show := func(n int) string { return "got " + strings.Repeat("x", n) }
	res := map[string]map[int][]int{}
	var log strings.Builder
	ctx := context.Background()
	if err := keep(ctx, &log, res, "herald", 100, func() (int, error) { return 2, nil }, show); err != nil {
		t.Fatalf("a measurement that worked: %v", err)
	}
	if err := keep(ctx, &log, res, "herald", 100, func() (int, error) { return 0, errors.New("boom") }, show); err != nil {
		t.Fatalf("a measurement that failed with ctx alive ended the rounds: %v", err)
	}
	if err := keep(ctx, &log, res, "nats", 100, func() (int, error) { return 0, errors.New("down") }, show); err != nil {
		t.Fatalf("a measurement that failed with ctx alive ended the rounds: %v", err)
	}
	if got := res["herald"][100]; len(got) != 1 || got[0] != 2 {
		t.Errorf("herald's samples at 100: %v, want [2]", got)
	}
	if got := res["nats"][100]; len(got) != 0 {
		t.Errorf("nats's samples at 100: %v, want none", got)
	}
	if want := "got xx\nerror: boom\nerror: down\n"; log.String() != want {
		t.Errorf("log %q, want %q", log.String(), want)
	}

	ended, cancel := context.WithCancel(ctx)
	cancel()
	err := keep(ended, &log, res, "herald", 100, func() (int, error) { return 0, errors.New("interrupted") }, show)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("a failure once ctx ended: %v, want context.Canceled", err)
	}
	if got := res["herald"][100]; len(got) != 1 {
		t.Errorf("herald's samples after the interrupted one: %v, want [2]", got)
	}
}
