package idempotency

import (
	"testing"
	"time"
)

// waitFor polls cond for up to 10 seconds: long enough for a loaded CI
// machine, bounded so that a broken build fails instead of hanging.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		waitTick()
	}
}

func waitTick() { time.Sleep(5 * time.Millisecond) }
