package redis

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"
)

// tlsDialer verifies each server against the host of the address it dials,
// which one tls.Config cannot do for the many nodes of a Cluster.
func tlsDialer(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("splitting address %q: %w", addr, err)
		}
		d := tls.Dialer{
			NetDialer: &net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute},
			Config:    &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12},
		}
		return d.DialContext(ctx, network, addr)
	}
}
