package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A chore is database-wide work the instances share (hygiene, retention):
// one instance at a time runs it, once per interval whatever the
// instances. Its lock is a transaction-level advisory lock held by a
// transaction open on a connection of its own for the run (a session lock
// does not survive a transaction-mode pooler: its unlock can reach another
// server session, leaving the lock on the first one for good and no
// instance running the chore again); the run uses other connections of
// the pool. The chores table records when each last ran, as that
// transaction commits.

// choreDue is whether chore $1 is due: it never ran, or ran 9/10 of its
// interval ($2 seconds) ago (instances' timers drift, and one just late
// should not wait a whole interval), or its last run is recorded ahead of
// the database's clock (the clock stepped back since: the chore would wait
// for it to catch up). Ahead of clock_timestamp(), not now(): a run that
// began after this transaction and ended before its lock was taken is not
// ahead.
const choreDue = `coalesce((SELECT ran_at < now() - make_interval(secs => $2) OR ran_at > clock_timestamp()
	FROM chores WHERE name = $1), true)`

// choreDueSQL tells whether chore $1 is due (choreDue). Read with no
// transaction and no lock, so that an instance to which it is not due,
// every instance but one in a mesh, asks only this.
const choreDueSQL = `-- herald:chore_due
SELECT ` + choreDue

// choreLockSQL takes the chore's lock ($3 names it, per schema) if it is
// free, and says whether the chore is still due once it is held.
const choreLockSQL = `-- herald:chore_lock
SELECT pg_try_advisory_xact_lock(hashtext($3 || current_schema()))
   AND ` + choreDue

// MinPoolConns is the least pool a Store runs its chores on with others
// (Chore, retention): their lock holds one connection for the run, which
// works on another. A smaller pool runs hygiene alone and no retention;
// Herald's server refuses one.
const MinPoolConns = 2

// heldChore is a chore's lock, held by a transaction on a connection of
// its own until release.
type heldChore struct {
	name   string
	holder *pgxpool.Conn
	tx     pgx.Tx
}

// takeChore takes chore name's lock (key: its advisory lock's name, before
// the schema) if no other instance holds it and the chore is due (every 0:
// always, when the lock is free); nil when it is not taken.
func (s *Store) takeChore(ctx context.Context, name, key string, every time.Duration) (*heldChore, error) {
	if s.pool.Config().MaxConns < MinPoolConns {
		// The holder would wait for a second connection it itself holds.
		return nil, fmt.Errorf("the pool needs at least %d connections (one holds the lock)", MinPoolConns)
	}
	due := 0.9 * every.Seconds()
	if every > 0 {
		var ok bool
		if err := s.pool.QueryRow(ctx, choreDueSQL, name, due).Scan(&ok); err != nil || !ok {
			return nil, err
		}
	}
	holder, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	h := &heldChore{name: name, holder: holder}
	if h.tx, err = holder.Begin(ctx); err != nil {
		holder.Release()
		return nil, err
	}
	var ok bool
	// The holder idles in its transaction while the run works: a run
	// longer than idle_in_transaction_session_timeout must keep its lock.
	if _, err = h.tx.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = 0`); err == nil {
		err = h.tx.QueryRow(ctx, choreLockSQL, name, due, key).Scan(&ok)
	}
	if err != nil || !ok {
		h.release(ctx)
		return nil, err
	}
	return h, nil
}

// done records the run and lets the lock go.
func (h *heldChore) done(ctx context.Context) error {
	if _, err := h.tx.Exec(ctx, `-- herald:chore_done
		INSERT INTO chores (name, ran_at) VALUES ($1, now()) ON CONFLICT (name) DO UPDATE SET ran_at = now()`, h.name); err != nil {
		return fmt.Errorf("recording the run: %w", err)
	}
	if err := h.tx.Commit(ctx); err != nil {
		return fmt.Errorf("recording the run: %w", err)
	}
	return nil
}

// release lets the lock go without recording a run (after done: nothing
// more) and gives the holder back.
func (h *heldChore) release(ctx context.Context) {
	_ = h.tx.Rollback(context.WithoutCancel(ctx))
	h.holder.Release()
}

// Chore runs fn unless another instance runs the chore name now or ran it
// less than every ago (ran is false then).
func (s *Store) Chore(ctx context.Context, name string, every time.Duration, fn func(context.Context)) (ran bool, err error) {
	return s.chore(ctx, "chore "+name, name, "herald_chore:"+name+":", every, func(ctx context.Context) error {
		fn(ctx)
		return nil
	})
}

// chore runs fn under chore name's lock (key: the lock's name, before the
// schema) if it is taken (takeChore), and records the run unless fn
// fails: the next round anywhere runs it again then. Errors of the lock
// and the record are wrapped with label; fn's are its own.
func (s *Store) chore(ctx context.Context, label, name, key string, every time.Duration, fn func(context.Context) error) (ran bool, err error) {
	h, err := s.takeChore(ctx, name, key, every)
	if err != nil {
		return false, fmt.Errorf("%s: taking the lock: %w", label, err)
	}
	if h == nil {
		return false, nil
	}
	defer h.release(ctx)
	if err := fn(ctx); err != nil {
		return true, err
	}
	if err := h.done(ctx); err != nil {
		return true, fmt.Errorf("%s: %w", label, err)
	}
	return true, nil
}
