package gateway

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/admin"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/spool"
)

// The maintenance modes (docs/design.md, "Maintenance modes"): two
// cluster-wide switches kept in the database (queue.SystemState), and what
// each instance does while they are on.
//
//   - push maintenance: pushes (HTTP, WebSocket) go to this instance's
//     durable buffer (spool.Dir) and are answered "buffered"; when it ends,
//     on any instance, each instance drains its buffer into the queue.
//   - pop maintenance: pops answer 204 at once, waiting long-polls are
//     answered 204, and the poller leases nothing for subscriptions
//     (poller.SetPaused) until it ends.
//
// An instance learns a switch from the request that flips it (on this
// instance), from the NOTIFY its transaction sends (Listener.OnState) or a
// syncnet datagram (Node's OnMaintenance), both of which only make it read
// the database again (RefreshMaintenance), and from its own periodic read
// (Config.MaintenanceRefresh), which heals a missed message.

// MaintenanceRefreshDefault is how often an instance reads the maintenance
// switches again when nothing told it they changed: the longest a missed
// NOTIFY or datagram leaves it behind.
const MaintenanceRefreshDefault = 5 * time.Second

// MaintenanceRefreshListening is the same for an instance that something
// else tells (internal/server sets it in every wake mode): a switch's
// NOTIFY while it listens, a datagram, and the members beat, which reads
// when a switch last changed every 2 s; the periodic read only heals what
// none covers. At 5 s it was a third of an idle instance's statements.
const MaintenanceRefreshListening = 30 * time.Second

// maintenanceReadTimeout bounds one read of the switches.
const maintenanceReadTimeout = 5 * time.Second

// maintenance is one instance's view of the switches, and its buffer.
type maintenance struct {
	s     *Server
	log   zerolog.Logger
	slog  zerolog.Logger // log, at most once a minute: what repeats every refresh
	spool *spool.Dir     // nil: no buffer configured

	push, pop atomic.Bool
	loaded    atomic.Bool // a read of the switches succeeded (a drain waits for one)
	dbHealthy atomic.Bool // the last read or drain reached the database
	closing   atomic.Bool // Server.Close: a drain under way stops

	mu sync.Mutex
	// popOn is closed when pop maintenance starts (waiting long-polls
	// answer 204); a new one is made when it ends. Guarded by mu.
	popOn chan struct{}
	// appliedAt is the UpdatedAt of the state applied last: a read older
	// than it (one that began before a switch and ended after it) is
	// ignored. Guarded by mu.
	appliedAt time.Time

	refresh chan struct{} // capacity 1: read the switches now
	drain   chan struct{} // capacity 1: look at the buffer now

	droppedN atomic.Uint64 // herald_buffer_dropped_total, for GET /api/v1/system/maintenance

	pushGauge, popGauge                 prometheus.Gauge
	appended, drained, dropped, refused prometheus.Counter
}

func newMaintenance(s *Server) (*maintenance, error) {
	m := &maintenance{s: s, log: s.log.With().Str("part", "maintenance").Logger(),
		popOn: make(chan struct{}), refresh: make(chan struct{}, 1), drain: make(chan struct{}, 1)}
	m.slog = m.log.Sample(&zerolog.BurstSampler{Burst: 1, Period: time.Minute})
	if s.cfg.BufferDir != "" {
		sp, err := spool.Open(spool.Config{Dir: s.cfg.BufferDir, MaxBytes: s.cfg.BufferMaxBytes, Logger: s.cfg.Logger})
		if err != nil {
			return nil, err
		}
		m.spool = sp
	}
	m.pushGauge = newGauge("herald_maintenance_mode",
		"1 while push maintenance is on (pushes are buffered on disk), as this instance last read it.")
	m.popGauge = newGauge("herald_pop_maintenance_mode",
		"1 while pop maintenance is on (pops answer 204, subscriptions get nothing), as this instance last read it.")
	m.appended = newCounter("herald_buffer_appended_total", "Messages written to this instance's push buffer during push maintenance.")
	m.drained = newCounter("herald_buffer_drained_total",
		"Buffered messages stored in the queue by the drain (a duplicate transactionId included).")
	m.dropped = newCounter("herald_buffer_dropped_total",
		"Buffered messages the drain could never store (an unreadable record, or input the queue refuses); each is logged.")
	m.refused = newCounter("herald_buffer_full_total", "Pushes answered 503 because the push buffer was full.")
	cs := []prometheus.Collector{m.pushGauge, m.popGauge, m.appended, m.drained, m.dropped, m.refused,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "herald_buffer_messages",
			Help: "Messages waiting in this instance's push buffer."}, func() float64 { return float64(m.stats().Records) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "herald_buffer_bytes",
			Help: "Size of this instance's push buffer file (bounded by --buffer-max-bytes)."}, func() float64 { return float64(m.stats().Bytes) }),
	}
	if err := register(s.reg, cs...); err != nil {
		m.closeSpool()
		return nil, err
	}
	return m, nil
}

// drop counts a buffered message the drain could never store.
func (m *maintenance) drop() {
	m.dropped.Inc()
	m.droppedN.Add(1)
}

// stats is the buffer's state; zero without one.
func (m *maintenance) stats() spool.Stats {
	if m.spool == nil {
		return spool.Stats{}
	}
	return m.spool.Stats()
}

// popStarted is closed when pop maintenance starts.
func (m *maintenance) popStarted() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.popOn
}

// apply makes st this instance's state: the poller pauses or resumes,
// waiting long-polls are answered, and the drain is told to look when push
// maintenance ended (or the first read found it off).
func (m *maintenance) apply(st queue.SystemState, source string) {
	first := !m.loaded.Swap(true)
	m.dbHealthy.Store(true)
	m.mu.Lock()
	if st.UpdatedAt.Before(m.appliedAt) {
		m.mu.Unlock()
		return // read before the state applied already: stale
	}
	m.appliedAt = st.UpdatedAt
	wasPush := m.push.Swap(st.Maintenance)
	popChanged := m.pop.Load() != st.PopMaintenance
	if popChanged {
		m.pop.Store(st.PopMaintenance)
		// Pause first: a long-poll woken by the close below finds nothing
		// leased for it any more.
		m.s.poller.SetPaused(st.PopMaintenance)
		if st.PopMaintenance {
			close(m.popOn)
		} else {
			m.popOn = make(chan struct{})
		}
	}
	m.mu.Unlock()
	m.pushGauge.Set(b2f(st.Maintenance))
	m.popGauge.Set(b2f(st.PopMaintenance))
	if wasPush != st.Maintenance {
		m.log.Info().Bool("enabled", st.Maintenance).Str("source", source).Str("by", st.UpdatedBy).
			Msg("push maintenance switched")
	}
	if popChanged {
		m.log.Info().Bool("enabled", st.PopMaintenance).Str("source", source).Str("by", st.UpdatedBy).
			Msg("pop maintenance switched")
	}
	if !st.Maintenance && (wasPush || first) {
		signal(m.drain)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// signal sends on a channel of capacity 1 without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// load reads the switches and applies them.
func (m *maintenance) load(ctx context.Context, source string) (queue.SystemState, error) {
	ctx, cancel := context.WithTimeout(ctx, maintenanceReadTimeout)
	defer cancel()
	st, err := m.s.store.SystemState(ctx)
	if err != nil {
		m.dbHealthy.Store(false)
		return st, err
	}
	m.apply(st, source)
	return st, nil
}

// LoadMaintenance reads the maintenance switches once and applies them.
// cmd/herald calls it before it serves, so an instance that starts during
// push maintenance buffers from its first request.
func (s *Server) LoadMaintenance(ctx context.Context) error {
	_, err := s.maint.load(ctx, "start")
	return err
}

// RefreshMaintenance makes RunMaintenance read the switches now: another
// instance says they changed (a NOTIFY, a syncnet datagram). It never
// blocks.
func (s *Server) RefreshMaintenance() { signal(s.maint.refresh) }

// RunMaintenance keeps this instance's maintenance state in step with the
// database, reading it every Config.MaintenanceRefresh and whenever
// RefreshMaintenance asks, and drains the push buffer into the queue
// whenever push maintenance is off and it holds something (at start, when
// maintenance ends, and at every refresh while records wait). It returns
// when ctx ends, after its goroutines have stopped.
func (s *Server) RunMaintenance(ctx context.Context) error {
	m := s.maint
	var wg sync.WaitGroup
	if m.spool != nil {
		wg.Go(func() { m.drainLoop(ctx) })
	}
	t := time.NewTicker(s.cfg.MaintenanceRefresh)
	defer t.Stop()
	source := "start"
	for {
		if _, err := m.load(ctx, source); err != nil && ctx.Err() == nil {
			m.slog.Warn().Err(err).Msg("reading the maintenance switches; keeping what was known")
		}
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil
		case <-t.C:
			source = "periodic"
		case <-m.refresh:
			source = "peer"
		}
	}
}

func (m *maintenance) drainLoop(ctx context.Context) {
	t := time.NewTicker(m.s.cfg.MaintenanceRefresh)
	defer t.Stop()
	for {
		m.drainOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.drain:
		}
	}
}

// drainOnce drains the buffer if push maintenance is off, as the database
// says now (not as this instance last heard).
func (m *maintenance) drainOnce(ctx context.Context) {
	if !m.loaded.Load() || m.push.Load() || m.closing.Load() || !m.spool.Waiting() {
		return
	}
	st, err := m.load(ctx, "drain")
	if err != nil || st.Maintenance {
		return
	}
	stop := func() bool { return m.push.Load() || m.closing.Load() || ctx.Err() != nil }
	start := time.Now()
	n, err := m.spool.Drain(ctx, stop, m.storeRecords)
	switch {
	case errors.Is(err, spool.ErrClosed) || (err != nil && ctx.Err() != nil):
	case err != nil:
		m.slog.Warn().Err(err).Int("stored", n).Int("waiting", m.stats().Records).
			Msg("draining the push buffer stopped; it goes on at the next refresh")
	case n > 0:
		m.log.Info().Int("stored", n).Dur("took", time.Since(start)).Msg("push buffer drained into the queue")
	}
}

// closeSpool releases the buffer file (Server.Close).
func (m *maintenance) closeSpool() {
	m.closing.Store(true)
	if m.spool != nil {
		if err := m.spool.Close(); err != nil {
			m.log.Error().Err(err).Msg("closing the push buffer")
		}
	}
}

// Current reads the switches from the database and applies them; when the
// database cannot be read, it answers with what this instance knows (and
// dbHealthy turns false). For the admin routes (admin.Maintenance).
func (m *maintenance) Current(ctx context.Context) queue.SystemState {
	if st, err := m.load(ctx, "request"); err == nil {
		return st
	}
	return queue.SystemState{Maintenance: m.push.Load(), PopMaintenance: m.pop.Load()}
}

// Set stores a switch, applies it here at once and tells the other
// instances (the transaction's NOTIFY, and Config.OnMaintenance: syncnet).
func (m *maintenance) Set(ctx context.Context, key string, enabled bool) (queue.SystemState, error) {
	st, err := m.s.store.SetSystemFlag(ctx, key, enabled)
	if err != nil {
		return queue.SystemState{}, err
	}
	m.apply(st, "request")
	if f := m.s.cfg.OnMaintenance; f != nil {
		f(key == queue.StatePopMaintenance, enabled)
	}
	return st, nil
}

// Buffer reports this instance's push buffer (admin.Maintenance).
func (m *maintenance) Buffer() admin.BufferState {
	st := m.stats()
	return admin.BufferState{Records: st.Records, Healthy: m.spool != nil && st.Healthy,
		Dropped: int(m.droppedN.Load()), DBHealthy: m.dbHealthy.Load()}
}
