package testproc

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Proc is a server process that a test started and watches until it exits.
type Proc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for
}

// Ready says how Start tells that a server serves.
type Ready struct {
	// Check returns nil once the server serves; it is called at once, then
	// every Poll.
	Check func() error
	// What is what Check waits for, as the timeout error words it:
	// "<server> did not <What> within <Timeout>".
	What    string
	Timeout time.Duration
	Poll    time.Duration
	// Kill stops a server that did not serve within Timeout;
	// (*Proc).Kill when nil.
	Kill func(*Proc)
}

// Start runs cmd with its output appended to the file logPath and returns
// once ready.Check succeeds. A server that exits first is reported with
// the last lines it logged in this run, not those of an earlier run in the
// same log; one that does not serve within ready.Timeout is killed.
func Start(cmd *exec.Cmd, logPath string, ready Ready) (*Proc, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log file: %w", err)
	}
	defer logFile.Close()
	logStart, _ := logFile.Seek(0, io.SeekEnd)

	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("running %s: %w", cmd.Path, err)
	}
	p := &Proc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()

	name := filepath.Base(cmd.Path)
	deadline := time.Now().Add(ready.Timeout)
	for {
		if ready.Check() == nil {
			return p, nil
		}
		select {
		case <-p.exited:
			out, _ := os.ReadFile(logPath)
			if int64(len(out)) >= logStart {
				out = out[logStart:]
			}
			return nil, fmt.Errorf("%s exited early: %s", name, LastLines(string(out), 5))
		case <-time.After(ready.Poll):
		}
		if time.Now().After(deadline) {
			if ready.Kill != nil {
				ready.Kill(p)
			} else {
				p.Kill()
			}
			return nil, fmt.Errorf("%s did not %s within %v", name, ready.What, ready.Timeout)
		}
	}
}

// Pid is the process ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Wait blocks until the process has exited.
func (p *Proc) Wait() { <-p.exited }

// Kill sends SIGKILL, like a crash, and waits for the exit. Killing a
// process that has exited already does nothing.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	p.Wait()
}

// LastLines is the last n lines of s, to quote a long output in an error.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
