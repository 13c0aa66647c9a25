package earlysignals

import (
	"slices"
	"testing"

	"slurm-k8s-bridge/agent/internal/waiter"
)

// The constructor's list in C, Kept and the waiter's own list must name the same signals.
func TestKeptAreTheWaitersEarlySignals(t *testing.T) {
	if !slices.Equal(Kept, waiter.EarlyKept) {
		t.Fatalf("Kept = %v, the waiter keeps %v", Kept, waiter.EarlyKept)
	}
}

// A test binary starts with nothing pending.
func TestNothingIsTakenWhenNothingWasPending(t *testing.T) {
	if taken := Taken(); len(taken) != 0 {
		t.Fatalf("Taken() = %v", taken)
	}
}
