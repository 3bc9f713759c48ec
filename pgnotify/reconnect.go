package pgnotify

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// reconnecting runs session until ctx ends. After a failure it waits with
// exponential back-off (±10% jitter) between lo and hi, starting over from
// lo when the failed session had been up (connected reports that), and
// counts the reconnect.
func reconnecting(ctx context.Context, lo, hi time.Duration, reconnects prometheus.Counter, log zerolog.Logger,
	session func(context.Context) (connected bool, err error)) {
	backoff := lo
	for ctx.Err() == nil {
		connected, err := session(ctx)
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
