package pgnotify

import (
	"cmp"
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// backoffOrDefaults is the back-off bounds of a Config: lo and hi, or
// BackoffMinDefault and BackoffMaxDefault where they are zero.
func backoffOrDefaults(lo, hi time.Duration) (time.Duration, time.Duration) {
	return cmp.Or(lo, BackoffMinDefault), cmp.Or(hi, BackoffMaxDefault)
}

// reconnecting runs session until ctx ends. After a failure it waits with
// exponential back-off (±10% jitter) between lo and hi, starting over from
// lo when the failed session had been up (connected reports that), and
// counts the reconnect. A session calls up once it is up: the first call
// of all closes ready, later ones do nothing.
func reconnecting(ctx context.Context, lo, hi time.Duration, reconnects prometheus.Counter, log zerolog.Logger,
	ready chan struct{}, session func(ctx context.Context, up func()) (connected bool, err error)) {
	first := true
	up := func() {
		if first {
			first = false
			close(ready)
		}
	}
	backoff := lo
	for ctx.Err() == nil {
		connected, err := session(ctx, up)
		if ctx.Err() != nil {
			return
		}
		if connected {
			backoff = lo
		}
		reconnects.Inc()
		log.Warn().Err(err).Dur("retry_in", backoff).Msg("connection lost")
		select {
		case <-ctx.Done():
			return
		case <-time.After(jitter(backoff)):
		}
		if !connected {
			backoff = min(backoff*2, hi)
		}
	}
}
