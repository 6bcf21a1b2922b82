package file

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/store"
	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// childDir, when set, makes TestCompletedRecordSurvivesSIGKILL act as the
// child process it starts: a Caddy that dies without any cleanup.
const childDir = "IDEMPOTENCY_FILE_TEST_CHILD_DIR"

func TestCompletedRecordSurvivesSIGKILL(t *testing.T) {
	if dir := os.Getenv(childDir); dir != "" {
		runChild(t, dir)
		return
	}
	dir := t.TempDir()
	line := killChild(t, "TestCompletedRecordSurvivesSIGKILL", childDir+"="+dir)
	var doneKey store.Key
	if err := parseLine(line, doneKey[:]); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}
	// The kernel dropped the child's lock: this must not time out.
	s := storetest.Provision(t, &Store{Path: dir})
	ctx := context.Background()
	got, err := s.Acquire(ctx, doneKey, claim(time.Minute))
	if rec := got.Record; err != nil || rec == nil || rec.State != store.Completed || rec.Status != 201 || string(rec.Body) != "survived" {
		t.Fatalf("completed record after SIGKILL = %+v, %v", rec, err)
	}
	// The claims the child leaves: TestClaimsSurviveSIGKILL.
}

// killChild starts this test binary running only test, with env, reads
// the line it prints after "READY ", kills it with SIGKILL, and returns
// the line.
func killChild(t *testing.T, test string, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				lines <- line
				return
			}
		}
		close(lines)
	}()
	var line string
	select {
	case l, ok := <-lines:
		if !ok {
			cmd.Wait()
			t.Fatalf("child exited before it was ready: %s", stderr.String())
		}
		line = l
	case <-time.After(30 * time.Second):
		t.Fatal("child was not ready within 30s")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	return line
}

// runChild completes one record, reports its key, then waits to be killed.
func runChild(t *testing.T, dir string) {
	s := storetest.Provision(t, &Store{Path: dir})
	ctx := context.Background()
	done, c := storetest.NewKey(), claim(time.Minute)
	if _, err := s.Acquire(ctx, done, c); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, done, c, &store.Response{Status: 201, Body: []byte("survived")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("READY %x\n", done[:])
	for {
		time.Sleep(time.Hour)
	}
}

func parseLine(line string, dst ...[]byte) error {
	fields := strings.Fields(line)
	if len(fields) != len(dst) {
		return fmt.Errorf("%d fields, want %d", len(fields), len(dst))
	}
	for i, f := range fields {
		b, err := hex.DecodeString(f)
		if err != nil || len(b) != len(dst[i]) {
			return fmt.Errorf("field %d: %q", i, f)
		}
		copy(dst[i], b)
	}
	return nil
}
