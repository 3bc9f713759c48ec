package queue

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Hygiene is a sample of the database's housekeeping state.
type Hygiene struct {
	Tables map[string]TableStats // Herald's tables, by name
	// OldestXminAge is the age (in transactions) of the oldest snapshot a
	// session or replication slot holds; vacuum cannot remove rows newer
	// than it. OldestXminHeld is how long the transaction holding the
	// oldest session snapshot has been open (zero for none).
	OldestXminAge  int64
	OldestXminHeld time.Duration
	OldestXminBy   string // application_name and pid of that session
	// SlotRetainedBytes is the WAL the replication slot furthest behind
	// keeps on disk (zero without slots); InactiveSlots counts the slots
	// no client streams from, which retain WAL until dropped.
	SlotRetainedBytes int64
	InactiveSlots     int64
	// Backlog is what consumer groups have not finished, the BacklogTop
	// pairs with the most waiting; DeadLetters the BacklogTop largest
	// dead-letter queues (hygiene_backlog.go).
	Backlog     []GroupBacklog
	DeadLetters []DeadLetterCount
}

// TableStats are one table's size and dead rows.
type TableStats struct {
	Bytes    int64 // with indexes and TOAST
	Live     int64
	Dead     int64
	Vacuumed time.Time // last (auto)vacuum, zero if never
}

// SampleHygiene reads table sizes, dead rows, the oldest xmin horizon and
// the replication slots (three cheap catalog queries), and the consumer
// backlog and dead-letter counts (two bounded queries, see
// hygiene_backlog.go).
func (s *Store) SampleHygiene(ctx context.Context) (*Hygiene, error) {
	h := &Hygiene{Tables: map[string]TableStats{}}
	rows, err := s.pool.Query(ctx, `-- herald:hygiene_tables
		SELECT relname, pg_total_relation_size(relid), n_live_tup, n_dead_tup,
		       coalesce(greatest(last_vacuum, last_autovacuum), 'epoch'::timestamptz)
		FROM pg_stat_user_tables
		WHERE schemaname = current_schema()
		  AND relname IN ('queues', 'partitions', 'messages', 'consumers', 'consumer_groups', 'dead_letters', 'traces')`)
	if err != nil {
		return nil, fmt.Errorf("reading table stats: %w", err)
	}
	for rows.Next() {
		var name string
		var t TableStats
		var vac time.Time
		if err := rows.Scan(&name, &t.Bytes, &t.Live, &t.Dead, &vac); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading table stats: %w", err)
		}
		if vac.Unix() > 0 {
			t.Vacuumed = vac // greatest() skips NULLs; 'epoch' stands for never
		}
		h.Tables[name] = t
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading table stats: %w", err)
	}
	var held float64
	if err := s.pool.QueryRow(ctx, `-- herald:hygiene_xmin
		SELECT coalesce(max(age(backend_xmin)), 0),
		       coalesce(extract(epoch FROM max(now() - xact_start)), 0)::float8,
		       coalesce((SELECT application_name || ' (pid ' || pid || ')' FROM pg_stat_activity
		                 WHERE backend_xmin IS NOT NULL ORDER BY age(backend_xmin) DESC LIMIT 1), '')
		FROM pg_stat_activity WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()`).Scan(
		&h.OldestXminAge, &held, &h.OldestXminBy); err != nil {
		return nil, fmt.Errorf("reading the xmin horizon: %w", err)
	}
	h.OldestXminHeld = time.Duration(held * float64(time.Second))
	var slotAge int64
	// On a standby pg_current_wal_lsn fails; the received position stands
	// in for it there.
	if err := s.pool.QueryRow(ctx, `-- herald:hygiene_slots
		SELECT coalesce(max(greatest(age(xmin), age(catalog_xmin))), 0),
		       coalesce(max(pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn()
		                                         ELSE pg_current_wal_lsn() END, restart_lsn)), 0)::bigint,
		       count(*) FILTER (WHERE NOT active)
		FROM pg_replication_slots`).Scan(&slotAge, &h.SlotRetainedBytes, &h.InactiveSlots); err != nil {
		return nil, fmt.Errorf("reading replication slots: %w", err)
	}
	h.OldestXminAge = max(h.OldestXminAge, slotAge)
	if err := s.sampleBacklog(ctx, h); err != nil {
		return nil, err
	}
	return h, nil
}

// grownTablesSQL lists the tables pops, pre-flights and pushes look up by
// index that take more than twice the pages their statistics say (and
// 16 more at least, 128 kB; a table never analyzed counts as empty). Their
// size on disk, not the activity statistics' n_live_tup: a backend reports
// its counts at most once a second, so the growth a statement just
// committed was not there yet, and a check right after it saw nothing. The
// planner scales a table's row estimate by its current pages too.
const grownTablesSQL = `-- herald:grown_tables
SELECT c.relname::text FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relname IN ('partitions', 'consumers', 'messages')
  AND pg_relation_size(c.oid) / current_setting('block_size')::int > 2 * greatest(c.relpages, 0) + 16`

// analyzeEvery bounds how often a push that creates partitions checks for
// grown tables (AnalyzeGrown).
const analyzeEvery = 10 * time.Second

// AnalyzeGrown runs ANALYZE on the tables that have more than doubled since
// their statistics were taken, and returns their names. Plans are cached per
// connection (generic plans, see ParsePoolConfig), and one made while a
// table held a few rows scans and sorts it once it holds a hundred thousand:
// a pre-flight over 100,000 partitions took 50 ms instead of 0.2. ANALYZE
// invalidates those plans. Autovacuum would too, at its next round
// (autovacuum_naptime, a minute by default), which is long when a queue
// grows by thousands of partitions a second.
func (s *Store) AnalyzeGrown(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, grownTablesSQL)
	if err != nil {
		return nil, fmt.Errorf("finding grown tables: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(names) == 0 {
		return nil, err
	}
	ids := make([]string, len(names))
	for i, n := range names {
		ids[i] = pgx.Identifier{n}.Sanitize()
	}
	if _, err := s.pool.Exec(ctx, "-- herald:analyze\nANALYZE "+strings.Join(ids, ", ")); err != nil {
		return nil, fmt.Errorf("analyzing %s: %w", strings.Join(names, ", "), err)
	}
	s.log.Info().Strs("tables", names).Msg("analyzed tables that doubled since their statistics, so cached plans follow")
	return names, nil
}

// analyzeIfDue runs AnalyzeGrown at most once per analyzeEvery, for the
// paths that add many rows at once; a failure is logged, not returned.
func (s *Store) analyzeIfDue(ctx context.Context) {
	now := time.Now().UnixNano()
	last := s.lastAnalyze.Load()
	if now-last < int64(analyzeEvery) || !s.lastAnalyze.CompareAndSwap(last, now) {
		return
	}
	if _, err := s.AnalyzeGrown(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn().Err(err).Msg("analyzing grown tables")
	}
}

// analyzeGrown runs AnalyzeGrown now; a failure is logged, not returned.
func (s *Store) analyzeGrown(ctx context.Context) {
	if _, err := s.AnalyzeGrown(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn().Err(err).Msg("analyzing grown tables")
	}
}

// XminWarnAfter: a snapshot held longer than this is logged as a warning.
const XminWarnAfter = 5 * time.Minute

// RunHygieneLoop samples every interval until ctx ends, hands each sample
// to report, and warns when a session holds the xmin horizon too long. It
// also repairs consumer rows a push did not mark ready (RepairReady): once
// at its start, then every interval; and every interval deletes the traces
// past Config.TraceRetention (PruneTraces).
func (s *Store) RunHygieneLoop(ctx context.Context, interval time.Duration, report func(*Hygiene)) error {
	repair := func() {
		if _, err := s.RepairReady(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("repairing ready consumer rows")
		}
	}
	repair()
	every(ctx, interval, func() {
		// Database-wide: one instance at a time, once per interval
		// whatever the instances (Chore); a pool of one runs it alone.
		if s.pool.Config().MaxConns < MinPoolConns {
			s.hygieneRound(ctx, repair, report)
			return
		}
		if _, err := s.Chore(ctx, "hygiene", interval, func(ctx context.Context) { s.hygieneRound(ctx, repair, report) }); err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("hygiene")
		}
	})
	return nil
}

// hygieneRound is one round of RunHygieneLoop.
func (s *Store) hygieneRound(ctx context.Context, repair func(), report func(*Hygiene)) {
	repair()
	s.pruneTraces(ctx)
	s.analyzeIfDue(ctx)
	h, err := s.SampleHygiene(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("sampling storage hygiene")
		}
		return
	}
	if h.OldestXminHeld > XminWarnAfter {
		s.log.Warn().Dur("held", h.OldestXminHeld).Int64("xmin_age", h.OldestXminAge).Str("by", h.OldestXminBy).
			Msg("a transaction has held the xmin horizon for over 5 minutes: vacuum cannot clean up behind it")
	}
	if report != nil {
		report(h)
	}
}
