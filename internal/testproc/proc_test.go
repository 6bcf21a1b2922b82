package testproc

import (
	"errors"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

var errNotYet = errors.New("not serving yet")

func TestStartReady(t *testing.T) {
	calls := 0
	p, err := Start(exec.Command("sleep", "30"), filepath.Join(t.TempDir(), "log"), Ready{
		Check: func() error {
			if calls++; calls < 3 {
				return errNotYet
			}
			return nil
		},
		What: "serve", Timeout: 10 * time.Second, Poll: time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 3 {
		t.Errorf("Check called %d times, want 3", calls)
	}
	p.Kill()
	p.Kill() // a second Kill of an exited process returns at once
}

// The early-exit error quotes what the server logged in this run only:
// a restart appends to the log of the runs before it.
func TestStartExitedEarly(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log")
	never := Ready{Check: func() error { return errNotYet }, What: "serve", Timeout: 10 * time.Second, Poll: time.Millisecond}
	for _, run := range []struct{ script, want string }{
		{"for i in 1 2 3 4 5 6 7; do echo first $i; done; exit 1", "first 3\nfirst 4\nfirst 5\nfirst 6\nfirst 7"},
		{"echo second 1; echo second 2; exit 1", "second 1\nsecond 2"},
	} {
		_, err := Start(exec.Command("sh", "-c", run.script), log, never)
		if want := "sh exited early: " + run.want; err == nil || err.Error() != want {
			t.Errorf("error %v, want %q", err, want)
		}
	}
}

func TestStartTimeout(t *testing.T) {
	var killed *Proc
	_, err := Start(exec.Command("sleep", "30"), filepath.Join(t.TempDir(), "log"), Ready{
		Check:   func() error { return errNotYet },
		What:    "serve on :1",
		Timeout: 100 * time.Millisecond,
		Poll:    10 * time.Millisecond,
		Kill: func(p *Proc) {
			killed = p
			p.Kill()
		},
	})
	if err == nil || err.Error() != "sleep did not serve on :1 within 100ms" {
		t.Fatalf("error %v, want the timeout", err)
	}
	if killed == nil {
		t.Fatal("the server that did not serve in time was not killed")
	}
	select {
	case <-killed.exited:
	default:
		t.Error("Kill returned before the process exited")
	}
}

func TestLastLines(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"", 2, ""},
		{"one\n", 2, "one"},
		{"a\nb\nc\n", 2, "b\nc"},
		{"x\ny\nz", 5, "x\ny\nz"},
	} {
		if got := LastLines(c.in, c.n); got != c.want {
			t.Errorf("LastLines(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}
