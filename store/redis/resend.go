package redis

import (
	"context"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// resend is a completion written again until the replicas have it or its
// claim's lease, deadline, passes. That bounds the work (a record written
// every replica_timeout), not what is at stake: the replicas' copy of the
// claim lives on past its lease, as any claim does (keyLife), and a failover
// that loses the completion afterwards brings it back as a dead owner's
// claim, which a retry takes over and runs again or, with
// on_unknown_outcome keep, turns into its unknown outcome. resendScript
// checks what the key holds, not the time, so nothing here depends on when
// the claim expires.
type resend struct {
	key      string
	owner    []byte // the claim's owner prefix
	record   []byte // the completed record, a copy
	expires  time.Time
	deadline time.Time
}

func (r *replication) retry(rs resend) {
	select {
	case r.retries <- rs:
	default:
		r.abandon(1, "too many completions wait for the replicas")
	}
}

func (r *replication) abandon(n int, why string) {
	r.abandoned.Add(float64(n))
	r.logger.Error("gave up sending completions to the replicas; a failover before they catch up may lose them, and their retries run again",
		zap.Int("completions", n), zap.String("reason", why))
}

// run resends the missed completions every replica_timeout, until ctx ends.
func (r *replication) run(ctx context.Context) {
	tick := time.NewTicker(max(r.timeout, 50*time.Millisecond))
	defer tick.Stop()
	var pending []resend
	for {
		select {
		case <-ctx.Done():
			if len(pending) > 0 {
				r.abandon(len(pending), "the config was unloaded")
			}
			return
		case rs := <-r.retries:
			if len(pending) >= retryCompletions {
				r.abandon(1, "too many completions wait for the replicas")
			} else {
				pending = append(pending, rs)
			}
			continue
		case <-tick.C:
		}
		if len(pending) > 0 {
			pending = r.resendAll(ctx, pending)
		}
	}
}

// resendScript writes the record again for WAIT to count, if the key holds
// it or the owner's claim (a failover lost the completion, not the claim).
var resendScript = goredis.NewScript(endsClaim + `
local head = redis.call('GETRANGE', KEYS[1], 0, #ARGV[1] - 1)
if head ~= ARGV[1] and head ~= string.sub(ARGV[2], 1, #ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
`)

// resendAll resends pending, one WAIT per master, returning those still short.
func (r *replication) resendAll(ctx context.Context, pending []resend) []resend {
	now := now()
	byNode := make(map[*goredis.Client][]resend)
	kept := pending[:0]
	late := 0
	for _, rs := range pending {
		if now.After(rs.deadline) || now.After(rs.expires) {
			late++
			continue
		}
		node, err := r.master(ctx, rs.key)
		if err != nil {
			kept = append(kept, rs)
			continue
		}
		byNode[node] = append(byNode[node], rs)
	}
	if late > 0 {
		r.abandon(late, "the lease passed")
	}
	for node, group := range byNode {
		callCtx, cancel := context.WithTimeout(ctx, 2*r.timeout+time.Second)
		var wait *goredis.IntCmd
		results := make([]*goredis.Cmd, len(group))
		_, _ = node.Pipelined(callCtx, func(p goredis.Pipeliner) error {
			for i, rs := range group {
				results[i] = resendScript.Eval(callCtx, p, []string{rs.key}, rs.owner, rs.record, millis(rs.expires.Sub(now)))
			}
			wait = r.queueWait(callCtx, p)
			return nil
		})
		cancel()
		n, werr := wait.Result()
		for i, rs := range group {
			written, err := results[i].Int64()
			switch {
			case err == nil && written == 0:
				// Purged, expired or taken over: nothing left to protect.
			case err == nil && werr == nil && int(n) >= r.want:
				r.logger.Info("the replicas have a completion they had missed")
			default:
				kept = append(kept, rs)
			}
		}
	}
	return kept
}
