package queue

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
)

// An instance id (Config.InstanceID) names the owner of the leases an
// instance takes for its streams (WebSocket and SSE subscriptions; the
// leases clients pop over HTTP record id + "#pop", leaseOwner). It must be
// unique among the live instances of one database schema: a restarted
// instance gives back, by its id, the leases its previous life's streams
// held (ReleaseInstanceLeases), and would give back a live twin's. LockInstance guards that: it holds an advisory lock keyed on
// the schema and the id for as long as the instance lives.

// popOwnerSuffix marks the owner of a lease popped by a client (an HTTP
// pop, wait=false or a long-poll): InstanceID + popOwnerSuffix. The client
// holds that lease whatever becomes of the instance that answered it, so
// ReleaseInstanceLeases, which matches InstanceID exactly, never ends it.
const popOwnerSuffix = "#pop"

// leaseOwner is the lease_owner a lease taken by this instance records:
// its id for a stream's (a WebSocket or SSE subscription, which dies with
// the process), its id + "#pop" for a client's.
func (s *Store) leaseOwner(stream bool) string {
	if stream {
		return s.cfg.InstanceID
	}
	return s.cfg.InstanceID + popOwnerSuffix
}

// ErrInstanceInUse: another live session holds the instance id's lock.
var ErrInstanceInUse = errors.New("the instance id is in use by another live instance")

// instanceLockSQL takes the instance id's advisory lock, if free. The key
// covers the schema: instances of other deployments (and of other tests)
// in the same database may share an id.
// It also reads when the server's postmaster started: a database that
// restarted, or another server (a promoted standby), starts at another
// time (see InstanceLock.OnDatabaseChanged).
const instanceLockSQL = `-- herald:instance_lock
SELECT pg_try_advisory_lock(hashtextextended('herald instance ' || current_schema() || ' ' || $1::text, 0)),
       pg_postmaster_start_time()::text`

// instanceKeepaliveSQL makes PostgreSQL notice within about 25 s that the
// lock's client is gone when its host died without closing the socket
// (the default waits for the kernel's keepalive, two hours): the id is free
// again for the instance's next life. Without effect over a Unix socket,
// where the peer's death is seen at once.
const instanceKeepaliveSQL = `-- herald:instance_keepalive
SELECT set_config('tcp_keepalives_idle', '10', false), set_config('tcp_keepalives_interval', '5', false),
       set_config('tcp_keepalives_count', '3', false)`

// keepAlive sets dialKeepAlive on c's TCP socket, as the pool's dialer
// does: a direct connection (pgx.Connect) has Go's default, which gives up
// on a dead host after 150 s. A Unix socket has none (a peer's death is
// seen at once). Nothing is sent on the lock's connection while it is
// held, so the probes are what sees a database host that died without
// closing the socket, within about 11 s: before the server's side gives
// up (instanceKeepaliveSQL, 25 s) and a twin could take the id. They wake
// neither this process nor the backend.
func keepAlive(c net.Conn) {
	if t := connUnder[*net.TCPConn](c); t != nil {
		_ = t.SetKeepAliveConfig(dialKeepAlive)
	}
}

// InstanceLockRetry is how often a lost instance lock is tried again
// until it is taken.
const InstanceLockRetry = time.Second

// InstanceLock is the advisory lock of an instance id, held by a connection
// of its own (not the pool's) for the instance's life. A goroutine of its
// own (keep) waits on that connection's socket, which sends nothing while
// the lock is held (no ping on a timer: an idle instance wakes for
// nothing); when the connection is lost (PostgreSQL restarted, the backend
// was terminated, the peer's keepalives went unanswered) so is the lock,
// and it takes the lock again on a new connection, every InstanceLockRetry
// until it has it. Held says whether it holds it now.
type InstanceLock struct {
	s    *Store
	url  string
	conn *pgx.Conn // owned by keep once it runs

	held   atomic.Bool
	pid    atomic.Uint32 // the lock's backend, for logs and tests
	cancel context.CancelFunc
	done   chan struct{}

	// started is when the postmaster of the database the lock was last
	// taken on started (pg_postmaster_start_time).
	started atomic.Pointer[string]
	changed atomic.Pointer[func()] // OnDatabaseChanged's
}

// OnDatabaseChanged sets f to be called when the lock, lost with its
// connection, is taken again on a database whose postmaster started at
// another time than the one it was held on: the server restarted, or the
// connection string now leads to another server (a promoted standby).
// What that database has may be older than what the last one answered
// (a failover to an asynchronous standby loses what it had not received:
// acks that ended leases, pops that made them). f runs on the lock's
// goroutine: it must not block.
func (l *InstanceLock) OnDatabaseChanged(f func()) {
	if l != nil {
		l.changed.Store(&f)
	}
}

// LockInstance takes the advisory lock of Config.InstanceID on a connection
// of its own: to url if given (a direct connection, when the pool goes
// through a transaction-mode pooler that would lose a session lock), else
// one taken out of the pool for good. ErrInstanceInUse: another live
// instance holds it. The lock lasts while that connection does; when it is
// lost (a restart of PostgreSQL frees it) it is taken again, on a new
// connection (see InstanceLock). Close lets it go.
func (s *Store) LockInstance(ctx context.Context, url string) (*InstanceLock, error) {
	conn, started, err := s.lockInstanceConn(ctx, url)
	if err != nil {
		return nil, err
	}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &InstanceLock{s: s, url: url, conn: conn, cancel: cancel, done: make(chan struct{})}
	l.started.Store(&started)
	l.held.Store(true)
	l.pid.Store(conn.PgConn().PID())
	go l.keep(kctx)
	return l, nil
}

// InstanceLockApplication is the application_name of the instance lock's
// session.
const InstanceLockApplication = "herald instance lock"

// lockInstanceConn opens the lock's connection and takes the lock on it;
// started is when the database's postmaster started.
func (s *Store) lockInstanceConn(ctx context.Context, url string) (_ *pgx.Conn, started string, err error) {
	var conn *pgx.Conn
	if url != "" {
		if conn, err = pgx.Connect(ctx, url); err != nil {
			return nil, "", fmt.Errorf("connecting for the instance lock: %w", err)
		}
	} else {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return nil, "", fmt.Errorf("acquiring a connection for the instance lock: %w", err)
		}
		conn = c.Hijack()
	}
	defer func() {
		if err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}()
	keepAlive(conn.PgConn().Conn())
	if _, err := conn.Exec(ctx, instanceKeepaliveSQL); err != nil {
		return nil, "", fmt.Errorf("setting the instance lock's keepalives: %w", err)
	}
	// Named in pg_stat_activity: the one session of Herald's that holds an
	// advisory lock while idle, on purpose.
	if _, err := conn.Exec(ctx, "SET application_name = '"+InstanceLockApplication+"'"); err != nil {
		return nil, "", fmt.Errorf("naming the instance lock's session: %w", err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, instanceLockSQL, s.cfg.InstanceID).Scan(&ok, &started); err != nil {
		return nil, "", fmt.Errorf("locking instance id %s: %w", s.cfg.InstanceID, err)
	}
	if !ok {
		return nil, "", fmt.Errorf("locking instance id %s: %w", s.cfg.InstanceID, ErrInstanceInUse)
	}
	return conn, started, nil
}

// keep waits on the lock's connection until it is lost, then takes the
// lock again, trying every InstanceLockRetry until it has it; it ends with
// ctx (Close).
func (l *InstanceLock) keep(ctx context.Context) {
	defer close(l.done)
	log := l.s.log.With().Str("instance", l.s.cfg.InstanceID).Logger()
	for ctx.Err() == nil {
		if l.conn != nil {
			l.watch(ctx, log)
			continue
		}
		if l.retake(ctx, log) {
			continue
		}
		t := time.NewTimer(InstanceLockRetry)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// watch blocks on the lock's connection until it is lost or ctx ends.
// Nothing LISTENs on it, so the wait reads only what the server sends
// unasked: a FATAL error as it terminates the backend, then the end of the
// socket; or the client's keepalives give up (keepAlive).
func (l *InstanceLock) watch(ctx context.Context, log zerolog.Logger) {
	err := l.conn.PgConn().WaitForNotification(ctx)
	if err == nil || ctx.Err() != nil {
		return // a notification, which nothing asked for; or Close
	}
	l.held.Store(false)
	log.Error().Err(err).Msg("lost the instance id's lock with its connection; taking it again")
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	_ = l.conn.Close(cctx)
	cancel()
	l.conn = nil
}

// retake is one try to take the lock again on a new connection.
func (l *InstanceLock) retake(ctx context.Context, log zerolog.Logger) bool {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	conn, started, err := l.s.lockInstanceConn(lctx, l.url)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			log.Warn().Err(err).Msg("taking the instance id's lock again failed; retrying")
		}
		return false
	}
	l.conn = conn
	l.pid.Store(conn.PgConn().PID())
	l.held.Store(true)
	log.Info().Msg("took the instance id's lock again")
	if was := *l.started.Swap(&started); was != started {
		log.Warn().Str("was_started", was).Str("started", started).
			Msg("the database is not the one the lock was held on (restarted, or failed over): reconciling this instance's leases")
		if f := l.changed.Load(); f != nil {
			(*f)()
		}
	}
	return true
}

// Held reports whether the lock is held now (false while its connection is
// lost and it is not taken again yet). False on nil.
func (l *InstanceLock) Held() bool { return l != nil && l.held.Load() }

// Close lets the lock go (stopping its keeper, then closing its
// connection). Safe on nil and twice.
func (l *InstanceLock) Close(ctx context.Context) error {
	if l == nil || l.cancel == nil {
		return nil
	}
	l.cancel()
	<-l.done
	l.cancel = nil
	l.held.Store(false)
	if l.conn == nil {
		return nil
	}
	err := l.conn.Close(ctx)
	l.conn = nil
	return err
}

// freeOwnedLeasesSQL is a statement named name that ends, without
// counting an attempt, every lease owned by $1 (the instance's streams';
// not the "#pop" leases its clients hold) that filter (a condition on
// consumers c, or empty) also selects, locking the rows in key order first
// (as releaseLeaseSQL). Its CTE freed names what it gave back (queue,
// partition, partition id, group); tail is the SELECT that follows. The
// scan goes through consumers_lease_id (leased rows only).
func freeOwnedLeasesSQL(name, filter, tail string) string {
	where := `c.lease_id IS NOT NULL AND c.lease_owner = $1`
	if filter != "" {
		where += `
	  AND ` + filter
	}
	return "-- herald:" + name + `
WITH lk AS (
	SELECT c.partition_id, c.consumer_group FROM consumers c
	WHERE ` + where + `
	ORDER BY c.partition_id, c.consumer_group
	FOR NO KEY UPDATE OF c
), up AS (
	UPDATE consumers c SET lease_id = NULL, lease_owner = NULL, lease_expires_at = NULL, lease_from = NULL, lease_to = NULL,
		` + copyLastOffset + `
	FROM lk
	WHERE c.partition_id = lk.partition_id AND c.consumer_group = lk.consumer_group
	  AND ` + where + `
	RETURNING c.partition_id, c.consumer_group
), freed AS (
	SELECT q.name AS queue, p.name AS partition, up.partition_id::text AS partition_id, up.consumer_group
	FROM up JOIN partitions p ON p.id = up.partition_id JOIN queues q ON q.id = p.queue_id
)
` + tail
}

// releaseInstanceSQL ends every lease owned by $1 and names what it freed.
// It counts no attempt: the gateway's crash is not the consumer's failure.
var releaseInstanceSQL = freeOwnedLeasesSQL("release_instance_leases", "", `SELECT * FROM freed`)

// FreedLease is a (partition, group) whose lease ReleaseInstanceLeases
// gave back.
type FreedLease struct {
	Queue, Partition, PartitionID, Group string
}

// ReleaseInstanceLeases gives back at once every lease recorded under this
// instance's id (Config.InstanceID), without counting a failed attempt: a
// restarted instance's previous life held them for its streams, and those
// died with it. Leases its clients popped (owner id + "#pop") are the
// clients' own: they end by ack, release or expiry only. Call it at start, before serving, with the id's lock held
// (LockInstance), so that no live instance's leases are touched.
func (s *Store) ReleaseInstanceLeases(ctx context.Context) ([]FreedLease, error) {
	rows, err := s.pool.Query(ctx, releaseInstanceSQL, s.cfg.InstanceID)
	if err != nil {
		return nil, fmt.Errorf("releasing the leases of instance %s: %w", s.cfg.InstanceID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (FreedLease, error) {
		var l FreedLease
		err := r.Scan(&l.Queue, &l.Partition, &l.PartitionID, &l.Group)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("releasing the leases of instance %s: %w", s.cfg.InstanceID, err)
	}
	return out, nil
}
