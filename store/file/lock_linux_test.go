//go:build linux

package file

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store/storetest"
)

// caddy validate, run by a user who cannot write the store's directory,
// beside the Caddy that runs on it and holds the file's lock: Provision,
// which takes no lock then, still refuses the path (issue 35, defect 15).
func TestProvisionRefusesAnUnwritableDirectoryWithoutTheLock(t *testing.T) {
	dir := t.TempDir()
	first := storetest.Provision(t, &Store{Path: dir})
	if _, err := first.Acquire(context.Background(), storetest.NewKey(), claim(time.Minute)); err != nil {
		t.Fatal(err) // the journal has a claim
	}
	first.Cleanup()
	// The files take the validating user's writes; their directory not.
	for _, name := range []string{fileName, journalName} {
		if err := os.Chmod(filepath.Join(dir, name), 0o666); err != nil {
			t.Fatal(err)
		}
	}
	other, err := bolt.Open(filepath.Join(dir, fileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o755)
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil { // so that the user reaches it
		t.Fatal(err)
	}

	err = asAnotherUser(t, func() error { return tryProvision(&Store{Path: dir}) })
	if err == nil || !strings.Contains(err.Error(), "does not take new files") {
		t.Fatalf("Provision on a directory the user cannot write, while another process holds the lock = %v; want it refused", err)
	}
}

// asAnotherUser runs f with the permissions of a user who owns no file
// here: nobody's, on a thread of its own, if the test runs as root (whom
// no mode stops); else the test's own user's.
func asAnotherUser(t *testing.T, f func() error) error {
	t.Helper()
	if os.Geteuid() != 0 {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, whose file-system user is nobody,
		// ends with the goroutine.
		runtime.LockOSThread()
		const nobody = 65534
		syscall.Setfsgid(nobody)
		syscall.Setfsuid(nobody)
		errc <- f()
	}()
	return <-errc
}
