// Package e2e tests the idempotency handler as users meet it: a real Caddy
// binary built with xcaddy from the working tree, reverse_proxy to a real
// upstream started by the test, and real redis-server and PostgreSQL
// processes.
//
// TestMain builds the binary once (../xcaddy.sh with CADDY_OUT); set
// CADDY_BIN to the path of a binary built beforehand to skip the build.
// TestCoreOnOldestCaddy runs the core tests again on the oldest supported
// Caddy, from CADDY_BIN_OLDEST or built by the test.
package e2e
