package queue

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
)

// IsUnavailable reports whether err says the database could not be reached
// or stopped answering, rather than that it refused the request: a dial or
// connect that failed or timed out, a connection that broke (EOF, reset,
// closed), a deadline that passed while waiting for it, a server shutting
// down or not yet accepting (SQLSTATE class 08, 57P01-57P03), or a standby
// answering a write (25006, read_only_sql_transaction: a failover is under
// way). The gateway answers these with 503 and Retry-After; a client may
// try again once the database is back. A caller's own cancellation
// (context.Canceled) is not one.
func IsUnavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			pgErr.Code == "57P01", // admin_shutdown
			pgErr.Code == "57P02", // crash_shutdown
			pgErr.Code == "57P03", // cannot_connect_now
			pgErr.Code == "25006", // read_only_sql_transaction: a standby
			pgErr.Code == "53300": // too_many_connections
			return true
		}
		return false
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err):
		return true
	case errors.As(err, &connErr), errors.As(err, &netErr):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE):
		return true
	case pgconn.SafeToRetry(err):
		return true // never sent: the connection was closed or broken before
	}
	// pgconn's closed-connection errors and pgxpool's closed pool (Herald
	// shutting down) carry no type.
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "closed pool")
}

// OutcomeUnknown reports whether a statement that failed with err may
// still have committed: the request was sent (pgconn.SafeToRetry is
// false), and the database did not answer with an error of the statement
// (a *pgconn.PgError: the statement failed, and its autocommit
// transaction with it) but lost the connection, or ended it with a FATAL
// error (pg_terminate_backend, a shutdown: 57P01, 57P02). A backend
// terminated just after its commit reports the FATAL error in place of
// the statement's answer (a commit waiting for a synchronous standby says
// so: "the transaction has already committed locally"). Whoever
// generated the lease ids of such a statement gives them back
// (Store.ReleaseLease): it may have leased under them although its answer
// was lost.
func OutcomeUnknown(err error) bool {
	if err == nil || pgconn.SafeToRetry(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC"
	}
	return true
}

// commitLostError is the failure of a request that carried a COMMIT and
// did not get the database's answer to it: the transaction may have
// committed. pgx reports a connection lost while it read the answer of a
// simple-protocol statement (tx.Commit sends "commit" so) as "conn
// closed", safe to retry, as if nothing had been sent; this says it is
// not (OutcomeUnknown).
type commitLostError struct{ err error }

func (e *commitLostError) Error() string     { return e.err.Error() }
func (e *commitLostError) Unwrap() error     { return e.err }
func (e *commitLostError) SafeToRetry() bool { return false }

// commitUnknown marks err, the failure of a request that carried a
// COMMIT, as of unknown outcome unless the database answered it with an
// error of the statement (then nothing committed).
func commitUnknown(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || errors.As(err, &pgErr) {
		return err
	}
	return &commitLostError{err: err}
}

// beginFunc is pgx.BeginFunc whose COMMIT, when its answer is lost, fails
// with an error OutcomeUnknown reports (commitUnknown).
func beginFunc(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, fn func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(ctx) // the error to return is fn's
		return err
	}
	return commitUnknown(tx.Commit(ctx))
}

// OutageLog logs database failures one line per change of state while the
// database is unavailable (IsUnavailable): the first such failure is
// logged with its reason, the ones after it only counted, and the first
// success after them (OK) logs that the database answers again with how
// many failures it held back. Other failures are logged as they come. At
// 200 requests a second an outage is two lines, not 400 a second. Safe for
// concurrent use; its zero value logs nothing (zerolog's zero Logger).
type OutageLog struct {
	Log zerolog.Logger

	down       atomic.Bool
	mu         sync.Mutex
	since      time.Time
	suppressed int
	reason     string
}

// Fail logs err (msg says what failed), or counts it during an outage.
func (o *OutageLog) Fail(err error, msg string) {
	if !IsUnavailable(err) {
		o.Log.Error().Err(err).Msg(msg)
		return
	}
	o.mu.Lock()
	if o.down.Load() {
		o.suppressed++
		o.mu.Unlock()
		return
	}
	o.down.Store(true)
	o.since, o.suppressed, o.reason = time.Now(), 0, err.Error()
	o.mu.Unlock()
	o.Log.Error().Err(err).Msg(msg + ": database unavailable; further failures are counted until it answers again")
}

// OK notes a success: it ends an outage. It costs one atomic load when
// there is none.
func (o *OutageLog) OK() {
	if !o.down.Load() {
		return
	}
	o.mu.Lock()
	if !o.down.Load() {
		o.mu.Unlock()
		return
	}
	o.down.Store(false)
	n, since := o.suppressed, o.since
	o.mu.Unlock()
	o.Log.Warn().Int("suppressed", n).Dur("after", time.Since(since)).Msg("database answers again")
}

// Down reports whether an outage is under way, and its first failure.
func (o *OutageLog) Down() (bool, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.down.Load(), o.reason
}
