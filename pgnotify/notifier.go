package pgnotify

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// WindowDefault is the least time between two NOTIFYs for one queue. 20 ms
// keeps cross-instance latency low while a queue pushed thousands of times
// a second still costs at most 50 NOTIFYs a second.
const WindowDefault = 20 * time.Millisecond

// Presence tells whether a NOTIFY for a queue would wake an instance that
// nothing else wakes (internal/server: false when syncnet woke every
// instance that listens).
type Presence interface {
	NeedsNotify(queue string) bool
}

// NotifierConfig configures a Notifier.
type NotifierConfig struct {
	// Pool sends the NOTIFYs. Required.
	Pool *pgxpool.Pool
	// Window: see WindowDefault; zero means the default.
	Window time.Duration
	// Presence, when set, lets the notifier skip the NOTIFYs nobody needs.
	Presence Presence
	// Sender, when set, is written into every NOTIFY so that this
	// instance's own Listener (with the same ListenerConfig.Self) skips
	// them: a push wakes its own instance directly.
	Sender string
	// Registerer receives the notifier's metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Logger; the zero value logs nothing.
	Logger zerolog.Logger
}

// Notifier sends the NOTIFYs that wake other instances after this
// instance's pushes. Pushes never NOTIFY inside their own transaction (a
// transaction that notifies takes a cluster-wide lock at commit) and never
// per row: Notify only records the queue, and one goroutine (Run) sends,
// per queue, on a leading and a trailing edge: a quiet queue's first push is
// announced at once, a busy queue gets one NOTIFY per window.
type Notifier struct {
	cfg  NotifierConfig
	log  zerolog.Logger
	kick chan struct{}

	mu      sync.Mutex
	pending map[string]map[string]bool // queue → partitions waiting to be announced
	last    map[string]time.Time       // queue → last NOTIFY

	channelName string        // looked up on first send; only Run's goroutine uses it
	sentCount   atomic.Uint64 // = sent, readable without a registry

	sent    prometheus.Counter
	batches prometheus.Counter
	skipped prometheus.Counter
}

// NewNotifier returns a Notifier; nothing is sent until Run.
func NewNotifier(cfg NotifierConfig) (*Notifier, error) {
	if cfg.Pool == nil {
		return nil, errors.New("pgnotify: NotifierConfig.Pool is required")
	}
	if cfg.Window == 0 {
		cfg.Window = WindowDefault
	}
	if cfg.Window < 0 {
		return nil, errors.New("pgnotify: NotifierConfig.Window must not be negative")
	}
	n := &Notifier{cfg: cfg, log: cfg.Logger.With().Str("component", "notifier").Logger(),
		kick: make(chan struct{}, 1), pending: map[string]map[string]bool{}, last: map[string]time.Time{},
		sent:    counter("herald_notify_sent_total", "NOTIFYs sent to wake other instances (one per queue per window at most)."),
		batches: counter("herald_notify_batches_total", "Transactions the notifier used to send NOTIFYs."),
		skipped: counter("herald_notify_skipped_total",
			"Wake-ups not sent because no instance needed them (syncnet woke every instance that listens)."),
	}
	if err := register(cfg.Registerer, n.sent, n.batches, n.skipped); err != nil {
		return nil, err
	}
	return n, nil
}

// Notify records that queue (partition, when known) got messages. It never
// blocks and never touches the database.
func (n *Notifier) Notify(queue, partition string) {
	if p := n.cfg.Presence; p != nil {
		if !p.NeedsNotify(queue) {
			n.skipped.Inc()
			return
		}
	}
	n.mu.Lock()
	parts := n.pending[queue]
	if parts == nil {
		parts = map[string]bool{}
		n.pending[queue] = parts
	}
	if partition != "" {
		parts[partition] = true
	}
	n.mu.Unlock()
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// Sent reports how many NOTIFYs have been sent.
func (n *Notifier) Sent() uint64 { return n.sentCount.Load() }

// Run sends until ctx ends, then sends what is still pending and returns.
func (n *Notifier) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			n.flush(context.WithoutCancel(ctx), true)
			return nil
		case <-n.kick:
		case <-timer.C:
		}
		next := n.flush(ctx, false)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), 0))
		}
	}
}

// flush sends every pending queue whose window has passed (all of them when
// final) and returns when the next one is due.
func (n *Notifier) flush(ctx context.Context, final bool) (next time.Time) {
	now := time.Now()
	var payloads []string
	n.mu.Lock()
	for q, parts := range n.pending {
		if due := n.last[q].Add(n.cfg.Window); !final && now.Before(due) {
			if next.IsZero() || due.Before(next) {
				next = due
			}
			continue
		}
		list := make([]string, 0, len(parts))
		for p := range parts {
			list = append(list, p)
		}
		sort.Strings(list)
		payloads = append(payloads, payload(q, list, n.cfg.Sender))
		n.last[q] = now
		delete(n.pending, q)
	}
	// Forget queues idle for a while, so the map stays small.
	for q, t := range n.last {
		if now.Sub(t) > 100*n.cfg.Window {
			delete(n.last, q)
		}
	}
	n.mu.Unlock()
	if len(payloads) == 0 {
		return next
	}
	if err := n.send(ctx, payloads); err != nil {
		// A lost NOTIFY costs latency, never a message: the sweep finds it.
		n.log.Warn().Err(err).Int("queues", len(payloads)).Msg("sending NOTIFY failed")
	}
	return next
}

// notifySQL sends the NOTIFYs ($1 the channel, $2 the payloads) in a
// transaction of its own that does not wait for its commit to reach disk:
// set_config(…, true) is local to the statement's transaction, the one the
// pipeline runs it in (no BEGIN or COMMIT statement: the extended protocol
// commits at the Sync). One statement where a BEGIN, a SET LOCAL and a
// COMMIT went with it.
const notifySQL = `-- herald:notify
SELECT count(pg_notify($1, p)), set_config('synchronous_commit', 'off', true) FROM unnest($2::text[]) AS p`

// send NOTIFYs in one short transaction that does not wait for its commit to
// reach disk: a lost NOTIFY is only a late wake-up.
func (n *Notifier) send(ctx context.Context, payloads []string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	channel, err := n.channel(ctx)
	if err != nil {
		return err
	}
	if _, err := n.cfg.Pool.Exec(ctx, notifySQL, channel, payloads); err != nil {
		return err
	}
	n.batches.Inc()
	n.sent.Add(float64(len(payloads)))
	n.sentCount.Add(uint64(len(payloads)))
	return nil
}

// channel is looked up on first use (Run's goroutine only).
func (n *Notifier) channel(ctx context.Context) (string, error) {
	if n.channelName == "" {
		c, err := Channel(ctx, n.cfg.Pool)
		if err != nil {
			return "", err
		}
		n.channelName = c
	}
	return n.channelName, nil
}
