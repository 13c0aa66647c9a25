package waiter

import "testing"

// Thousands of waiters that lost the daemon at once must not come back in step: the delays for
// one attempt are spread, not one value.
func TestBackoffDelaysAreSpread(t *testing.T) {
	seen := map[int64]bool{}
	for range 50 {
		seen[int64(reconnectDelay(3))] = true
	}
	if len(seen) <= 10 {
		t.Fatalf("50 delays for attempt 3 took %d values", len(seen))
	}
}
