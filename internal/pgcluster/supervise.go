package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Defaults of SuperviseConfig.
const (
	// CheckIntervalDefault: reading /proc twice every 100 ms costs nothing
	// and bounds how long a death goes unnoticed.
	CheckIntervalDefault = 100 * time.Millisecond
	// BackoffMinDefault and BackoffMaxDefault: the first restart comes
	// soon after a death; repeated failures slow down to one attempt per
	// 5 s.
	BackoffMinDefault = 200 * time.Millisecond
	BackoffMaxDefault = 5 * time.Second
	// MaxFailuresDefault: five failures in a row (about 6 s of back-off)
	// mean the cause will not go away by itself.
	MaxFailuresDefault = 5
	// AttemptTimeoutDefault bounds one restart attempt, which may wait for
	// a dead postmaster's children to exit and then for crash recovery.
	AttemptTimeoutDefault = time.Minute
)

// SuperviseConfig says how Supervise watches and restarts the postmaster.
type SuperviseConfig struct {
	// Interval is how often the postmaster is checked; zero means
	// CheckIntervalDefault.
	Interval time.Duration
	// BackoffMin is the wait before the first restart attempt after a
	// death; it doubles after each failed attempt up to BackoffMax. Zero
	// means BackoffMinDefault and BackoffMaxDefault.
	BackoffMin, BackoffMax time.Duration
	// MaxFailures is how many restart attempts in a row may fail before
	// Supervise gives up and returns an error; zero means
	// MaxFailuresDefault.
	MaxFailures int
	// AttemptTimeout bounds one restart attempt; zero means
	// AttemptTimeoutDefault.
	AttemptTimeout time.Duration
	// OnRestart, when set, is called after each successful restart, on
	// Supervise's goroutine (e.g. to drop a pool's dead connections). It
	// should not block long: the postmaster is not watched meanwhile.
	OnRestart func()
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c SuperviseConfig) WithDefaults() SuperviseConfig {
	if c.Interval <= 0 {
		c.Interval = CheckIntervalDefault
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = BackoffMinDefault
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = BackoffMaxDefault
	}
	c.BackoffMax = max(c.BackoffMax, c.BackoffMin)
	if c.MaxFailures <= 0 {
		c.MaxFailures = MaxFailuresDefault
	}
	if c.AttemptTimeout <= 0 {
		c.AttemptTimeout = AttemptTimeoutDefault
	}
	return c
}

// Health is the postmaster's state as Supervise sees it.
type Health struct {
	// Restarting is true from the moment Supervise notices the postmaster
	// is gone until it serves again (and stays true once Supervise gave up).
	Restarting bool
	// Restarts counts the successful restarts.
	Restarts int
	// Failures counts the failed restart attempts since the last success.
	Failures int
	// LastError is the last failed attempt's error, "" if none.
	LastError string
}

// Health reports the postmaster's state; the zero Health when nothing
// supervises it.
func (c *Cluster) Health() Health {
	c.healthMu.Lock()
	defer c.healthMu.Unlock()
	return c.health
}

func (c *Cluster) setHealth(f func(h *Health)) {
	c.healthMu.Lock()
	defer c.healthMu.Unlock()
	f(&c.health)
}

// errStopping ends a restart attempt that raced with Stop or Release.
var errStopping = errors.New("the cluster is being stopped")

// Supervise watches the postmaster until ctx ends or Stop or Release is
// called on c (it then returns nil), and restarts it when it dies: after
// BackoffMin, then after doubling waits up to BackoffMax while attempts
// fail. After MaxFailures failed attempts in a row it returns an error,
// and the postmaster stays down: the caller should exit so that its own
// supervisor acts.
//
// A restart never runs initdb (a missing cluster is a failure, not a
// reason to start an empty one) and uses the port of c's URL, so
// connections made from URL work again afterwards. When several processes
// share Dir, each one's Supervise notices the death; the first to take the
// start lock restarts the postmaster and the others find it running and
// reuse it. A postmaster that answers on another port than c's URL (one an
// operator started by hand) counts as a failed attempt.
//
// Call it once per Cluster.
func (c *Cluster) Supervise(ctx context.Context, cfg SuperviseConfig) error {
	cfg = cfg.WithDefaults()
	port := c.port
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	var last int    // the postmaster last seen serving
	var blind error // the probe's descriptor shortage, while it lasts
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if c.stopping.Load() {
			return nil
		}
		pf, err := readPIDFile(c.srv.pgdata)
		why, pid := judge(pf, err, port, last, func(pid int) presence { return probeProcess(pid, c.srv.pgdata) })
		switch {
		case fdExhausted(err) && blind == nil:
			blind = err
			c.srv.log.Warn().Err(err).Int("pid", last).
				Msg("out of file descriptors: postgres is judged by its process alone until they are back")
		case !fdExhausted(err) && blind != nil:
			blind = nil
			c.srv.log.Info().Msg("file descriptors are back: postgres is judged by postmaster.pid again")
		}
		if why == "" {
			if pid != 0 { // 0: not looked at (out of descriptors)
				last = pid
			}
			continue
		}
		c.srv.log.Error().Str("why", why).Msg("postgres is down: restarting it")
		c.setHealth(func(h *Health) { h.Restarting = true })
		last = 0 // the next one is read from postmaster.pid
		err = c.restart(ctx, cfg, port)
		switch {
		case errors.Is(err, errStopping) || ctx.Err() != nil:
			return nil
		case err != nil:
			return err
		}
		tick.Reset(cfg.Interval)
	}
}

// restart tries to bring the postmaster back with back-off until it
// serves, ctx ends or MaxFailures attempts failed in a row.
func (c *Cluster) restart(ctx context.Context, cfg SuperviseConfig, port int) error {
	began := time.Now()
	delay := cfg.BackoffMin
	for failures := 0; ; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		err := c.restartOnce(ctx, cfg, port)
		if fdExhausted(err) {
			// This process cannot open a file: a restart cannot be tried
			// now, and that says nothing of postgres. Not a failure: the
			// attempts go on, slowly, until descriptors are back.
			c.setHealth(func(h *Health) { h.LastError = err.Error() })
			delay = cfg.BackoffMax
			c.srv.log.Warn().Err(err).Dur("retry_in", delay).Msg("restarting postgres: out of file descriptors, trying again")
			continue
		}
		if err == nil {
			c.setHealth(func(h *Health) { h.Restarting, h.Failures = false, 0; h.Restarts++ })
			c.srv.log.Info().Int("port", port).Dur("down_for", time.Since(began)).Int("attempts", failures+1).
				Msg("postgres restarted")
			if cfg.OnRestart != nil {
				cfg.OnRestart()
			}
			return nil
		}
		if errors.Is(err, errStopping) || ctx.Err() != nil {
			return err
		}
		failures++
		c.setHealth(func(h *Health) { h.Failures = failures; h.LastError = err.Error() })
		if failures >= cfg.MaxFailures {
			return fmt.Errorf("restarting postgres: giving up after %d failed attempts in a row: %w", failures, err)
		}
		delay = min(2*delay, cfg.BackoffMax)
		c.srv.log.Warn().Err(err).Int("failures", failures).Dur("retry_in", delay).Msg("restarting postgres failed")
	}
}

// restartOnce is one attempt: under the start lock, like Start, so that it
// never races a Start, a Release or another process's restart.
func (c *Cluster) restartOnce(ctx context.Context, cfg SuperviseConfig, port int) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.AttemptTimeout)
	defer cancel()
	unlock, err := lockDir(ctx, c.srv.dir)
	if err != nil {
		return err
	}
	defer unlock()
	if c.stopping.Load() {
		return errStopping
	}
	if _, err := os.Stat(filepath.Join(c.srv.pgdata, "PG_VERSION")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("checking the data directory: %s holds no cluster any more: %w", c.srv.pgdata, err)
		}
		return fmt.Errorf("checking the data directory: %w", err)
	}
	scfg := c.cfg
	scfg.Port = port
	got, owned, err := c.srv.start(ctx, scfg)
	if err != nil {
		return err
	}
	if got != port {
		return fmt.Errorf("restarting postgres: a postmaster someone else started serves port %d, not %d, which this process connects to", got, port)
	}
	if owned {
		c.owned.Store(true) // ours now: Stop stops it
	}
	return nil
}

// judge is the liveness rule, applied to what a look at pgdata found: pf
// and readErr from reading postmaster.pid, last the postmaster last seen
// serving (0: none yet), probe a look at a process (probeProcess). It
// returns why no postmaster serves pgdata on port, or "" and the pid of the
// one that does.
//
// The postmaster is down when postmaster.pid is missing or unparsable, or
// names a process that does not serve the data directory or serves another
// port. That is read from a file and /proc only, which is cheap enough to
// do every 100 ms: a postmaster that is alive but slow (crash recovery after
// a backend died, which it does by itself) is not down.
//
// A look that failed for want of file descriptors (EMFILE, ENFILE: this
// process is at its open-file limit) is no evidence: the postmaster is then
// judged by its process alone, the last one seen serving, whose cwd link
// /proc gives without a descriptor; with none seen yet, or one that cannot
// be looked at either, it is not down.
func judge(pf pidFile, readErr error, port, last int, probe func(pid int) presence) (why string, pid int) {
	switch {
	case fdExhausted(readErr):
		if last > 0 && probe(last) == gone {
			return "postmaster " + strconv.Itoa(last) + " is gone", 0
		}
		return "", 0
	case readErr != nil:
		return readErr.Error(), 0
	}
	switch {
	case probe(pf.pid) == gone:
		return "postmaster " + strconv.Itoa(pf.pid) + " is gone", 0
	case pf.port != port:
		return "postmaster " + strconv.Itoa(pf.pid) + " serves port " + strconv.Itoa(pf.port) + ", not " + strconv.Itoa(port), 0
	}
	return "", pf.pid
}
