package file

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
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

const childLease = 2 * time.Second

func TestCompletedRecordSurvivesSIGKILL(t *testing.T) {
	if dir := os.Getenv(childDir); dir != "" {
		runChild(t, dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCompletedRecordSurvivesSIGKILL$", "-test.count=1")
	cmd.Env = append(os.Environ(), childDir+"="+dir)
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

	// The child prints the keys once Complete has returned.
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
			t.Fatalf("child exited without completing: %s", stderr.String())
		}
		line = l
	case <-time.After(30 * time.Second):
		t.Fatal("child did not complete its record within 30s")
	}
	// The child's claim was made before it spoke, so its lease ends by then.
	leaseEnd := time.Now().Add(childLease)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	var doneKey, heldKey store.Key
	var heldToken store.Token
	var claimedAt [8]byte
	if err := parseLine(line, doneKey[:], heldKey[:], heldToken[:], claimedAt[:]); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}
	// The kernel dropped the child's lock: this must not time out.
	s := storetest.Provision(t, &Store{Path: dir})
	ctx := context.Background()
	rec, err := s.Acquire(ctx, doneKey, claim(time.Minute))
	if err != nil || rec == nil || rec.State != store.Completed || rec.Status != 201 || string(rec.Body) != "survived" {
		t.Fatalf("completed record after SIGKILL = %+v, %v", rec, err)
	}
	// The claim was made after claimedAt, so it holds until at least then
	// plus its lease; a slow machine may leave too little time to check.
	if time.Now().Before(time.Unix(0, int64(binary.BigEndian.Uint64(claimedAt[:]))).Add(childLease - 100*time.Millisecond)) {
		if rec, err := s.Acquire(ctx, heldKey, claim(time.Minute)); err != nil || rec == nil || rec.Token != heldToken {
			t.Fatalf("the dead child's claim before its lease = %+v, %v; want it held", rec, err)
		}
	} else {
		t.Log("too slow to check the dead child's claim before its lease")
	}
	time.Sleep(time.Until(leaseEnd) + 50*time.Millisecond)
	if rec, err := s.Acquire(ctx, heldKey, claim(time.Minute)); rec != nil || err != nil {
		t.Fatalf("the dead child's claim after its lease = %+v, %v; want a takeover", rec, err)
	}
}

// runChild completes one record and holds a claim on another, reports
// both, then waits to be killed.
func runChild(t *testing.T, dir string) {
	s := storetest.Provision(t, &Store{Path: dir})
	ctx := context.Background()
	done, c := storetest.NewKey(), claim(time.Minute)
	if _, err := s.Acquire(ctx, done, c); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, done, c, &store.Record{Status: 201, Body: []byte("survived")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	held, hc := storetest.NewKey(), claim(childLease)
	claimedAt := binary.BigEndian.AppendUint64(nil, uint64(time.Now().UnixNano()))
	if _, err := s.Acquire(ctx, held, hc); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("READY %x %x %x %x\n", done[:], held[:], hc.Token[:], claimedAt)
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
