// Package testproc holds what the servers that tests start themselves
// (redis-server, PostgreSQL) have in common: a free loopback port to start
// on, the process watched from its start until it serves or exits, and
// retries while one starts.
package testproc

import (
	"fmt"
	"net"
	"time"
)

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// OnFreePort calls start with a free port until it succeeds, three times at
// most: another process may take the port between the probe and the
// server's bind. It returns the port start succeeded on, or start's last
// error.
func OnFreePort(start func(port int) error) (int, error) {
	var err error
	for range 3 {
		var port int
		if port, err = FreePort(); err != nil {
			return 0, err
		}
		if err = start(port); err == nil {
			return port, nil
		}
	}
	return 0, err
}

// Retry calls fn until it succeeds, attempts times at most with pause
// between them, and returns its last error.
func Retry(attempts int, pause time.Duration, fn func() error) error {
	var err error
	for i := range attempts {
		if i > 0 {
			time.Sleep(pause)
		}
		if err = fn(); err == nil {
			return nil
		}
	}
	return err
}
