package store

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestParseEvent(t *testing.T) {
	k := NewKey("", "a")
	for _, kind := range []byte{EventEnded, EventPurged} {
		got, key, ok := ParseEvent(string(AppendEvent(nil, kind, k)))
		if !ok || got != kind || key != k {
			t.Errorf("ParseEvent of kind %c = %c, %v, %t", kind, got, key, ok)
		}
	}
	for _, bad := range []string{"", "e", "x" + k.String(), "e" + k.String()[1:] + "g", "e" + k.String() + "0"} {
		if _, _, ok := ParseEvent(bad); ok {
			t.Errorf("ParseEvent(%q) accepted it", bad)
		}
	}
}

// A loss counts once against each store served, whatever the number of
// configs that serve it, and no more once the last has gone.
func TestLossCounter(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "losses"}, []string{"store"})
	c := NewLossCounter(vec)
	c.Add("a")
	c.Add("a") // a reload
	c.Add("b")
	c.Lost()
	c.Remove("a")
	c.Remove("b")
	c.Lost()
	c.Remove("a")
	c.Lost()
	if a, b := testutil.ToFloat64(vec.WithLabelValues("a")), testutil.ToFloat64(vec.WithLabelValues("b")); a != 2 || b != 1 {
		t.Fatalf("losses counted: a %v, b %v; want 2 and 1", a, b)
	}
}

// A session that held starts the backoff over; failures double it.
func TestKeepSubscribedBacksOff(t *testing.T) {
	stop := make(chan struct{})
	var starts []time.Time
	done := make(chan struct{})
	go func() {
		defer close(done)
		KeepSubscribed(stop, func() bool {
			starts = append(starts, time.Now())
			if len(starts) == 5 {
				close(stop)
			}
			return len(starts) == 3 // the third held
		})
	}()
	<-done
	gap := func(i int) time.Duration { return starts[i].Sub(starts[i-1]) }
	// 100ms, 200ms, then 100ms again after the session that held, where
	// the backoff would otherwise have reached 400ms.
	if gap(1) < 100*time.Millisecond || gap(2) < 200*time.Millisecond || gap(3) < 100*time.Millisecond || gap(3) >= 400*time.Millisecond {
		t.Fatalf("gaps %v %v %v; want 100ms, 200ms, then 100ms after the session that held", gap(1), gap(2), gap(3))
	}
}
