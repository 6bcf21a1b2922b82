package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// echoServer answers every line it reads with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends msg and reads it back, failing after timeout.
func roundTrip(c net.Conn, msg string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	c.SetDeadline(start.Add(timeout))
	if _, err := c.Write([]byte(msg)); err != nil {
		return 0, err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return time.Since(start), err
	}
	if string(buf) != msg {
		return 0, errors.New("echo mismatch: " + string(buf))
	}
	return time.Since(start), nil
}

func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded)
}

func TestForwards(t *testing.T) {
	p := Start(t, echoServer(t))
	c := dial(t, p.Addr())
	big := strings.Repeat("0123456789", 50000) // several chunks
	if _, err := roundTrip(c, big, 5*time.Second); err != nil {
		t.Fatalf("round trip of 500 kB: %v", err)
	}
	if p.Conns() != 1 || p.Accepted() != 1 {
		t.Fatalf("Conns %d Accepted %d, want 1 and 1", p.Conns(), p.Accepted())
	}
	if p.Target() == "" || p.Addr() == p.Target() {
		t.Fatalf("Addr %s Target %s", p.Addr(), p.Target())
	}
}

func TestLatency(t *testing.T) {
	p := Start(t, echoServer(t))
	c := dial(t, p.Addr())
	if d, err := roundTrip(c, "warm\n", time.Second); err != nil || d > 100*time.Millisecond {
		t.Fatalf("round trip without latency took %v: %v", d, err)
	}

	const lat = 100 * time.Millisecond
	p.SetLatency(lat)
	if p.Latency() != lat {
		t.Fatalf("Latency() = %v", p.Latency())
	}
	// Both directions are delayed: one round trip costs two latencies.
	d, err := roundTrip(c, "slow\n", 2*time.Second)
	if err != nil || d < 2*lat || d > 2*lat+300*time.Millisecond {
		t.Fatalf("round trip with %v latency took %v (%v), want about %v", lat, d, err, 2*lat)
	}

	// Pipelined chunks are each delayed, not delayed one after another:
	// ten writes 10 ms apart all come back about 2*lat after they were sent.
	c.SetDeadline(time.Now().Add(3 * time.Second))
	start := time.Now()
	go func() {
		for range 10 {
			c.Write([]byte("x"))
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if _, err := io.ReadFull(c, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 2*lat+80*time.Millisecond || d > 2*lat+500*time.Millisecond {
		t.Fatalf("ten pipelined chunks took %v, want about %v (latency must not accumulate)", d, 2*lat+90*time.Millisecond)
	}

	p.SetLatency(0)
	if d, err := roundTrip(c, "fast\n", time.Second); err != nil || d > 100*time.Millisecond {
		t.Fatalf("round trip after removing latency took %v: %v", d, err)
	}
}

func TestBlackhole(t *testing.T) {
	p := Start(t, echoServer(t))
	old := dial(t, p.Addr())
	if _, err := roundTrip(old, "hi\n", time.Second); err != nil {
		t.Fatal(err)
	}

	p.Blackhole(true)
	// An open connection: what is sent vanishes, nothing comes back, and
	// the connection stays open.
	if _, err := roundTrip(old, "lost\n", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("round trip through the blackhole = %v, want a timeout", err)
	}
	// A new connection is accepted, then nothing.
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "hello?\n", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("round trip on a blackholed new connection = %v, want a timeout", err)
	}
	if p.Conns() != 2 {
		t.Fatalf("Conns = %d, want both connections held open", p.Conns())
	}

	p.Heal()
	fresh := dial(t, p.Addr())
	if _, err := roundTrip(fresh, "back\n", time.Second); err != nil {
		t.Fatalf("new connection after the blackhole: %v", err)
	}
	// The connection that had an upstream forwards again (what was
	// swallowed stays lost).
	old.SetDeadline(time.Now().Add(time.Second))
	if _, err := old.Write([]byte("again\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(old).ReadString('\n')
	if err != nil || line != "again\n" {
		t.Fatalf("old connection after the blackhole read %q, %v", line, err)
	}
	// The one accepted into the blackhole never gets an upstream.
	if _, err := roundTrip(c, "still?\n", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("blackholed connection after Heal = %v, want a timeout", err)
	}
	p.Cut()
	if _, err := roundTrip(c, "x", time.Second); err == nil || isTimeout(err) {
		t.Fatalf("blackholed connection after Cut = %v, want closed", err)
	}
}

func TestCut(t *testing.T) {
	p := Start(t, echoServer(t))
	a, b := dial(t, p.Addr()), dial(t, p.Addr())
	for _, c := range []net.Conn{a, b} {
		if _, err := roundTrip(c, "hi\n", time.Second); err != nil {
			t.Fatal(err)
		}
	}
	p.Cut()
	for _, c := range []net.Conn{a, b} {
		c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Fatalf("read on a cut connection = %v, want EOF or reset", err)
		}
	}
	deadline := time.Now().Add(time.Second)
	for p.Conns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Conns = %d after Cut", p.Conns())
		}
		time.Sleep(5 * time.Millisecond)
	}
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "new\n", time.Second); err != nil {
		t.Fatalf("new connection after Cut: %v", err)
	}
}

func TestTargetDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := Start(t, addr)
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "x", time.Second); err == nil || isTimeout(err) {
		t.Fatalf("round trip to a dead target = %v, want the connection closed", err)
	}
}

func TestClose(t *testing.T) {
	p, err := New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "hi\n", time.Second); err != nil {
		t.Fatal(err)
	}
	p.SetLatency(time.Hour) // a chunk waiting to be written must not hold Close
	c.Write([]byte("queued"))
	done := make(chan error)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not return")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), 200*time.Millisecond); err == nil {
		t.Fatal("the proxy still accepts after Close")
	}
}

func TestLatencyPerDirection(t *testing.T) {
	// The server answers "ok" to each line and records when it got it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	arrived := make(chan time.Time, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
			arrived <- time.Now()
			c.Write([]byte("ok\n"))
		}
	}()
	p := Start(t, ln.Addr().String())
	const lat = 150 * time.Millisecond
	p.SetLatencies(0, lat)
	if up, down := p.Latencies(); up != 0 || down != lat {
		t.Fatalf("Latencies() = %v, %v", up, down)
	}
	c := dial(t, p.Addr())
	c.SetDeadline(time.Now().Add(2 * time.Second))
	sent := time.Now()
	if _, err := c.Write([]byte("req\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	answered := time.Since(sent)
	if got := (<-arrived).Sub(sent); got > 50*time.Millisecond {
		t.Fatalf("the request reached the server after %v, want at once", got)
	}
	if answered < lat || answered > lat+200*time.Millisecond {
		t.Fatalf("the answer came after %v, want about %v", answered, lat)
	}
}
