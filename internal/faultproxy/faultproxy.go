// Package faultproxy is a TCP proxy on loopback that a test puts between a
// client and a server (Redis, typically) to make the network misbehave on
// demand: add latency, swallow traffic (a blackhole), or cut every open
// connection. Faults are switched at run time and apply to connections that
// are already open as well as to new ones.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards every connection accepted on Addr to the target address.
type Proxy struct {
	target string
	ln     net.Listener

	toTarget  atomic.Int64 // nanoseconds added to every chunk sent to the target
	toClient  atomic.Int64 // and to every chunk sent back to the client
	blackhole atomic.Bool

	mu     sync.Mutex
	conns  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup // accept loop and every link's goroutines

	accepted atomic.Int64
}

// link is one client connection and, unless it was accepted into a
// blackhole, its upstream connection.
type link struct {
	client   net.Conn
	upstream net.Conn // nil for a connection held by the blackhole
	once     sync.Once
	done     chan struct{}
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.done)
		l.client.Close()
		if l.upstream != nil {
			l.upstream.Close()
		}
	})
}

// New starts a proxy listening on a free 127.0.0.1 port that forwards to
// target. Close stops it.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listening: %w", err)
	}
	p := &Proxy{target: target, ln: ln, conns: make(map[*link]struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Start is New for a test: it fails the test on error and closes the proxy
// when the test ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// Addr is the host:port clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// SetLatency delays every chunk of data by d in each direction, from the
// moment the proxy reads it to the moment it writes it on: a round trip
// through the proxy gains about 2*d. Chunks keep their order and the delay
// does not accumulate over pipelined chunks, as on a long link. Zero removes
// the delay for data read from then on.
func (p *Proxy) SetLatency(d time.Duration) { p.SetLatencies(d, d) }

// SetLatencies sets the delay of each direction on its own: toTarget for
// what clients send, toClient for what the target answers. A request that
// reaches the server at once but whose answer is late, for example, is
// SetLatencies(0, d).
func (p *Proxy) SetLatencies(toTarget, toClient time.Duration) {
	p.toTarget.Store(int64(toTarget))
	p.toClient.Store(int64(toClient))
}

// Latency is the current added delay towards the target.
func (p *Proxy) Latency() time.Duration { return time.Duration(p.toTarget.Load()) }

// Latencies are the current added delays towards the target and back.
func (p *Proxy) Latencies() (toTarget, toClient time.Duration) {
	return time.Duration(p.toTarget.Load()), time.Duration(p.toClient.Load())
}

// Blackhole, when on, makes the proxy swallow everything: data read on any
// connection, in either direction, is dropped, and new connections are
// accepted (the TCP handshake succeeds) but never connected upstream, so
// their callers wait for answers that never come. Turning it off resumes
// forwarding on the connections that had an upstream; the bytes dropped
// meanwhile are lost, so such a stream is usually unusable and the client
// should drop it. Connections accepted into the blackhole stay there until
// Cut or Close.
func (p *Proxy) Blackhole(on bool) { p.blackhole.Store(on) }

// Cut closes every open connection, both the client's side and the
// upstream's, as a network failure or a server restart would. New
// connections are accepted and forwarded as usual.
func (p *Proxy) Cut() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

// Heal removes every fault: no latency, no blackhole. Open connections are
// kept.
func (p *Proxy) Heal() {
	p.SetLatency(0)
	p.Blackhole(false)
}

// Conns is how many client connections are open.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Accepted is how many client connections the proxy has accepted in all.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Close stops accepting, cuts every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if already {
		return nil
	}
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		p.accepted.Add(1)
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve connects one accepted client upstream (unless the blackhole holds
// it) and starts copying.
func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	l := &link{client: c, done: make(chan struct{})}
	if !p.blackhole.Load() {
		up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			// The server is down: the client sees its connection closed.
			c.Close()
			return
		}
		l.upstream = up
	}
	if !p.register(l) {
		l.close()
		return
	}
	if l.upstream == nil {
		p.wg.Add(1)
		go p.swallow(l)
		return
	}
	p.wg.Add(2)
	go p.pump(l, l.client, l.upstream, &p.toTarget)
	go p.pump(l, l.upstream, l.client, &p.toClient)
}

func (p *Proxy) register(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[l] = struct{}{}
	return true
}

func (p *Proxy) unregister(l *link) {
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
	l.close()
}

// swallow reads and drops what a connection held by the blackhole sends.
func (p *Proxy) swallow(l *link) {
	defer p.wg.Done()
	defer p.unregister(l)
	_, _ = io.Copy(io.Discard, l.client)
}

// chunk is data read from one side, due to be written to the other.
type chunk struct {
	data []byte
	due  time.Time
}

// pump copies src to dst. A reader stamps each chunk with its due time and
// a writer delivers it then, so latency delays every chunk by the same
// amount without slowing the stream down. Either side failing closes the
// whole link.
func (p *Proxy) pump(l *link, src, dst net.Conn, latency *atomic.Int64) {
	defer p.wg.Done()
	defer p.unregister(l)

	queue := make(chan chunk, 64)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		timer := time.NewTimer(0)
		defer timer.Stop()
		for c := range queue {
			if wait := time.Until(c.due); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-l.done:
					return
				}
			}
			if _, err := dst.Write(c.data); err != nil {
				l.close()
				return
			}
		}
	}()
	defer func() {
		close(queue)
		<-writerDone
	}()

	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.blackhole.Load() {
			c := chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(time.Duration(latency.Load()))}
			select {
			case queue <- c:
			case <-l.done:
				return
			case <-writerDone:
				return
			}
		}
		if err != nil {
			// Deliver what is queued before closing, so a server's
			// last reply is not lost when it hangs up.
			return
		}
	}
}
