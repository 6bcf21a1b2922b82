package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

// Values of the {http.idempotency.result} placeholder.
const (
	resultNew      = "new"      // this request claimed the key and ran
	resultReplay   = "replay"   // answered from the store
	resultConflict = "conflict" // refused: the first request is still running
	resultMismatch = "mismatch" // refused: the key belongs to another request
	resultBypass   = "bypass"   // no key on a route that does not require one
	resultInvalid  = "invalid"  // refused: missing, malformed or repeated key
	resultTooLarge = "too_large"
	resultError    = "error" // the store failed (503, or passed through with fail_open)
)

// statusClientClosed is the status Caddy's reverse_proxy writes when the
// request's context ends before the upstream answers.
const statusClientClosed = 499

var trueValue = []string{"true"}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !h.covers(r.Method) {
		return next.ServeHTTP(w, r)
	}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)

	// The key is validated before anything touches the store.
	values := r.Header[h.keyField]
	switch {
	case len(values) == 0 && h.Required:
		return h.refuse(w, r, repl, resultInvalid, h.problems.missing)
	case len(values) == 0:
		h.setResult(repl, resultBypass)
		return next.ServeHTTP(w, r)
	case len(values) > 1:
		return h.refuse(w, r, repl, resultInvalid, h.problems.repeated)
	}
	clientKey, ok := parseKey(values[0])
	if !ok {
		return h.refuse(w, r, repl, resultInvalid, h.problems.invalid)
	}

	body, tooLarge, err := h.readBody(r)
	if err != nil {
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	if tooLarge {
		return h.refuse(w, r, repl, resultTooLarge, h.problems.tooLarge)
	}
	defer putBuffer(body)

	key := store.NewKey(repl.ReplaceAll(h.Scope, ""), clientKey)
	repl.Set("http.idempotency.key", key) // hex-encoded only if a log asks
	claim := &store.Claim{
		Token:       newToken(),
		Endpoint:    h.endpoint(r, repl),
		Fingerprint: fingerprint(r.URL.RawQuery, body),
		Lease:       time.Duration(h.LockTimeout),
	}
	rec, err := h.store.Acquire(r.Context(), key, claim)
	switch {
	case err != nil:
		return h.acquireFailed(w, r, repl, next, key, claim.Token, err)
	case rec != nil && rec.State == store.InProgress && h.MaxWait > 0 &&
		h.sameEndpoint(rec.Endpoint, claim.Endpoint) && rec.Fingerprint == claim.Fingerprint:
		return h.wait(w, r, repl, next, key, claim)
	case rec != nil:
		return h.answerFromRecord(w, r, repl, rec, claim)
	}
	h.setResult(repl, resultNew)
	h.claimed(key, claim)
	return h.execute(w, r, next, key, claim)
}

// setResult publishes the request's outcome to the access log placeholder
// and the metrics.
func (h *Handler) setResult(repl *caddy.Replacer, result string) {
	repl.Set("http.idempotency.result", resultValues[result])
	h.metrics.result(result)
}

// resultValues holds each result already boxed for the replacer: boxing a
// string on every request costs an allocation.
var resultValues = func() map[string]any {
	m := make(map[string]any)
	for _, r := range []string{resultNew, resultReplay, resultConflict, resultMismatch, resultBypass, resultInvalid, resultTooLarge, resultError} {
		m[r] = r
	}
	return m
}()

// claimed notes a claim that took over a dead owner's: its request may
// have run, or be running, on the instance that died.
func (h *Handler) claimed(key store.Key, c *store.Claim) {
	if c.TookOver {
		h.metrics.tookOver()
		h.logger.Info("took over the claim of a request whose lease passed; running it again",
			zap.String("key_hash", key.String()))
	}
}

func (h *Handler) covers(method string) bool {
	for _, m := range h.Methods {
		if m == method {
			return true
		}
	}
	return false
}

func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, result string, p *problem) error {
	h.setResult(repl, result)
	return p.answer(w, r, repl)
}

// readBody buffers the request body so that it can be fingerprinted, and
// puts back an identical body for the next handler. It refuses to read more
// than MaxRequestBody.
func (h *Handler) readBody(r *http.Request) (buf *bytes.Buffer, tooLarge bool, err error) {
	if r.ContentLength > h.MaxRequestBody {
		return nil, true, nil
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, false, nil
	}
	buf = bufPool.Get().(*bytes.Buffer)
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	body := new(bufferedBody)
	body.limit = io.LimitedReader{R: r.Body, N: h.MaxRequestBody + 1}
	_, err = buf.ReadFrom(&body.limit)
	if err != nil {
		putBuffer(buf)
		return nil, false, err
	}
	if int64(buf.Len()) > h.MaxRequestBody {
		putBuffer(buf)
		return nil, true, nil
	}
	r.Body.Close()
	body.limit = io.LimitedReader{}
	body.Reset(buf.Bytes())
	r.Body = body
	return buf, false, nil
}

// bufferedBody replays the buffered request body to the next handler. It
// also holds the reader that bounded the read, so that reading and
// replaying cost one allocation.
type bufferedBody struct {
	bytes.Reader
	limit io.LimitedReader
}

func (*bufferedBody) Close() error { return nil }

// digest is a pooled SHA-256 state with its scratch space: written through
// the hash.Hash interface, arrays on the stack would escape to the heap.
type digest struct {
	hash.Hash
	n   [8]byte
	sum [sha256.Size]byte
}

var digests = sync.Pool{New: func() any { return &digest{Hash: sha256.New()} }}

// fingerprint hashes what the request carries: its query and its body. The
// query is length-prefixed so no query and body can pass for another pair.
func fingerprint(query string, body *bytes.Buffer) store.Fingerprint {
	d := digests.Get().(*digest)
	defer digests.Put(d)
	d.Reset()
	binary.BigEndian.PutUint64(d.n[:], uint64(len(query)))
	d.Write(d.n[:])
	io.WriteString(d, query)
	if body != nil {
		d.Write(body.Bytes())
	}
	return store.Fingerprint(d.Sum(d.sum[:0]))
}

// answerFromRecord answers a request whose key already has a live record.
func (h *Handler) answerFromRecord(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, rec *store.Record, c *store.Claim) error {
	switch {
	case !h.sameEndpoint(rec.Endpoint, c.Endpoint):
		return h.refuse(w, r, repl, resultMismatch, h.problems.otherEndpoint)
	case rec.Fingerprint != c.Fingerprint:
		return h.refuse(w, r, repl, resultMismatch, h.problems.otherPayload)
	case rec.State == store.InProgress:
		return h.refuse(w, r, repl, resultConflict, h.problems.outstanding)
	case rec.Truncated:
		return h.refuse(w, r, repl, resultReplay, h.problems.unreplayable)
	}
	h.setResult(repl, resultReplay)
	hdr := w.Header()
	for name, values := range rec.Header {
		// Clip the slice: a later handler appending to a header must not
		// write into a record that other replays share.
		hdr[name] = values[:len(values):len(values)]
	}
	hdr[h.ReplayHeader] = trueValue
	hdr["Content-Length"] = []string{strconv.Itoa(len(rec.Body))}
	w.WriteHeader(rec.Status)
	_, err := w.Write(rec.Body)
	if err != nil {
		// the client left during a replay; it can retry again
		panic(http.ErrAbortHandler)
	}
	return nil
}

// acquireFailed answers a request whose claim the store could not take,
// per on_store_error, and withdraws the claim in case it lands late.
func (h *Handler) acquireFailed(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, next caddyhttp.Handler, key store.Key, tok store.Token, err error) error {
	h.withdraw(key, tok)
	h.setResult(repl, resultError)
	if h.OnStoreError == failOpen {
		h.logger.Warn("idempotency store unavailable; passing the request through unprotected (fail_open)",
			zap.String("key_hash", key.String()), zap.Error(err))
		return next.ServeHTTP(w, r)
	}
	h.logger.Error("idempotency store unavailable; refusing the request (fail_closed)",
		zap.String("key_hash", key.String()), zap.Error(err))
	return h.problems.storeUnavailable.answer(w, r, repl)
}

// background bounds the store calls retried after their request has
// ended, so that a long outage under load cannot pile up goroutines; past
// the bound, leases expire claims as they always would.
var background = make(chan struct{}, 64)

// retryLater calls op in the background, with a backoff from 100ms to 2s,
// until settled says its answer settles the matter or the claim's lease
// (which bounds what op can still change) has passed.
func (h *Handler) retryLater(op func(context.Context) error, settled func(error) bool) {
	select {
	case background <- struct{}{}:
	default:
		return
	}
	deadline := time.Now().Add(time.Duration(h.LockTimeout))
	go func() {
		defer func() { <-background }()
		for pause := 100 * time.Millisecond; time.Now().Before(deadline); pause = min(2*pause, 2*time.Second) {
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			err := op(ctx)
			cancel()
			if settled(err) {
				return
			}
			time.Sleep(pause)
		}
	}()
}

// withdraw releases a claim whose Acquire or Release failed. A timed-out
// claim may still land once the store recovers (the command was only
// delayed); left alone, it would answer the client's retry with 409 for a
// whole lease although nothing runs. Commands on other connections are not
// ordered with the delayed one, so the release is repeated until the store
// has answered twice (the second answer comes after the backlog that held
// the claim) or the claim was removed. The token is unique to this
// request, so a release can only ever remove this claim.
func (h *Handler) withdraw(key store.Key, tok store.Token) {
	answered := 0
	h.retryLater(func(ctx context.Context) error { return h.store.Release(ctx, key, tok) },
		func(err error) bool {
			if errors.Is(err, store.ErrNotOwner) {
				answered++
			}
			return err == nil || answered == 2
		})
}

// completeLater keeps trying to store a response the store refused while
// it was unavailable: until the lease passes, the claim is still this
// request's, and storing it spares the retry a second execution.
func (h *Handler) completeLater(key store.Key, c *store.Claim, rec *store.Record) {
	kept := &store.Record{Status: rec.Status, Header: rec.Header.Clone(), Body: bytes.Clone(rec.Body), Truncated: rec.Truncated}
	h.retryLater(func(ctx context.Context) error { return h.store.Complete(ctx, key, c, kept, time.Duration(h.TTL)) },
		func(err error) bool {
			switch {
			case err == nil:
				h.logger.Info("stored the response after the store recovered", zap.String("key_hash", key.String()))
			case errors.Is(err, store.ErrNotOwner):
				h.logger.Error("the store recovered too late: the lease passed before the response could be stored; a retry runs the request again",
					zap.String("key_hash", key.String()))
			default:
				return false
			}
			return true
		})
}

// execute runs the request as the owner of the key's claim and stores what
// it answered.
func (h *Handler) execute(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, key store.Key, c *store.Claim) (err error) {
	rw := newRecorder(w, h.MaxResponseBody)
	defer rw.free()
	h.metrics.claimHeld(1)
	defer h.metrics.claimHeld(-1)
	run, ctx := h.leases.start(r.Context(), key, c.Token)
	defer func() {
		if p := recover(); p != nil {
			h.leases.stop(run)
			h.finish(key, c, rw, nil, true)
			panic(p)
		}
	}()
	err = next.ServeHTTP(rw, r.WithContext(ctx))
	h.leases.stop(run) // before finishing, so a last renewal cannot race the release
	h.finish(key, c, rw, err, false)
	return err
}

// finish stores the response of a claimed request, or releases the claim
// when a retry should run the request anew.
func (h *Handler) finish(key store.Key, c *store.Claim, rw *recorder, handlerErr error, aborted bool) {
	defer finished.done(key)
	// The client's context is not used: its response is being stored for
	// its retry whether or not it stayed. Each store bounds its own calls.
	ctx := context.Background()

	status := rw.status
	if !rw.wroteHeader {
		if handlerErr != nil || aborted {
			// Nothing was answered: Caddy's error handling will, and the
			// retry runs again.
			h.release(ctx, key, c.Token, "handler failed before responding")
			return
		}
		status = http.StatusOK // the server answers an empty 200
	}
	if status >= 500 || status == statusClientClosed {
		// 5xx answers are not stored: the error may be transient. 499 is
		// what reverse_proxy writes when its request was cancelled before
		// the upstream answered (here: a hung upstream, one lease after
		// its client left): nothing was answered, so a retry runs again.
		h.release(ctx, key, c.Token, "no usable response")
		return
	}
	rec := &store.Record{Status: status, Header: rw.header, Body: rw.body()}
	if aborted || rw.overflow {
		// The upstream answered, so it did the work: never run it again,
		// but there is no whole response to replay.
		rec.Header, rec.Body, rec.Truncated = nil, nil, true
	}
	err := h.store.Complete(ctx, key, c, rec, time.Duration(h.TTL))
	switch {
	case errors.Is(err, store.ErrNotOwner):
		h.logger.Error("claim was lost before the response could be stored: the lease passed and another request took the key over (raise lock_timeout), or an operator purged it",
			zap.String("key_hash", key.String()))
	case err != nil:
		h.logger.Warn("storing the response failed; retrying until the lease passes",
			zap.String("key_hash", key.String()), zap.Error(err))
		h.completeLater(key, c, rec)
	}
}

func (h *Handler) release(ctx context.Context, key store.Key, tok store.Token, why string) {
	err := h.store.Release(ctx, key, tok)
	if err != nil && !errors.Is(err, store.ErrNotOwner) {
		h.logger.Warn("releasing the claim failed; retrying until the lease passes",
			zap.String("key_hash", key.String()), zap.String("reason", why), zap.Error(err))
		h.withdraw(key, tok)
	}
}
