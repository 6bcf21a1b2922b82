package main

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// A child that burns CPU and exits inside the window must still count: the
// postmaster's backends are children, and the parent's own utime+stime
// holds none of their time.
func TestProcTicksKeepsReapedChildren(t *testing.T) {
	tick := time.Second / 100 // USER_HZ on Linux
	before := procTicks(os.Getpid())
	cmd := exec.Command("sh", "-c", `i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if live := procTicks(os.Getpid()); live < before {
		t.Fatalf("ticks went down while the child ran: %d, then %d", before, live)
	}
	if err := cmd.Wait(); err != nil { // reaps it: its time moves to our cutime
		t.Fatal(err)
	}
	after := procTicks(os.Getpid())
	child := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	if child < 10*tick {
		t.Fatalf("the child used only %v of CPU; the loop is too short to tell", child)
	}
	// Our own goroutines add ticks too; the child's must all be there,
	// give or take a tick of rounding at each end.
	if got := time.Duration(after-before) * tick; got < child-2*tick {
		t.Fatalf("procTicks grew by %v while the reaped child alone used %v", got, child)
	}
}
