package queue

import (
	"context"
	"encoding/json"
	"fmt"
)

// postgresStatsSQL builds, in one statement, the reference server's
// postgres-stats document from PostgreSQL's statistics views, for the
// tables and indexes of Herald's schema (current_schema()). Lists are
// bounded (20 tables and indexes, 15 tables with dead rows or updates,
// 10 statements). bufferUsage needs pg_buffercache, which Herald does not
// install: it is always empty.
const postgresStatsSQL = `
SELECT jsonb_build_object(
  'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
  'database', current_database(),
  'databaseCache', COALESCE((SELECT jsonb_build_object('database', datname, 'diskReads', blks_read, 'cacheHits', blks_hit,
      'cacheHitRatio', round(blks_hit::numeric / NULLIF(blks_hit + blks_read, 0) * 100, 2))
    FROM pg_stat_database WHERE datname = current_database()), '{}'::jsonb),
  'tableCache', COALESCE((SELECT jsonb_agg(jsonb_build_object('schema', schemaname, 'table', relname,
      'diskReads', COALESCE(heap_blks_read, 0), 'cacheHits', COALESCE(heap_blks_hit, 0),
      'cacheHitRatio', round(heap_blks_hit::numeric / NULLIF(heap_blks_hit + heap_blks_read, 0) * 100, 2))
      ORDER BY heap_blks_read DESC NULLS LAST)
    FROM (SELECT * FROM pg_statio_user_tables WHERE schemaname = current_schema()
          ORDER BY heap_blks_read DESC NULLS LAST LIMIT 20) t), '[]'::jsonb),
  'indexCache', COALESCE((SELECT jsonb_agg(jsonb_build_object('schema', schemaname, 'table', relname, 'index', indexrelname,
      'diskReads', COALESCE(idx_blks_read, 0), 'cacheHits', COALESCE(idx_blks_hit, 0),
      'cacheHitRatio', round(idx_blks_hit::numeric / NULLIF(idx_blks_hit + idx_blks_read, 0) * 100, 2))
      ORDER BY idx_blks_read DESC NULLS LAST)
    FROM (SELECT * FROM pg_statio_user_indexes WHERE schemaname = current_schema()
          ORDER BY idx_blks_read DESC NULLS LAST LIMIT 20) i), '[]'::jsonb),
  'cacheSummary', jsonb_build_object(
    'tables', (SELECT jsonb_build_object('diskReads', COALESCE(sum(heap_blks_read), 0), 'cacheHits', COALESCE(sum(heap_blks_hit), 0),
        'hitRatio', round(sum(heap_blks_hit)::numeric / NULLIF(sum(heap_blks_hit) + sum(heap_blks_read), 0) * 100, 2))
      FROM pg_statio_user_tables WHERE schemaname = current_schema()),
    'indexes', (SELECT jsonb_build_object('diskReads', COALESCE(sum(idx_blks_read), 0), 'cacheHits', COALESCE(sum(idx_blks_hit), 0),
        'hitRatio', round(sum(idx_blks_hit)::numeric / NULLIF(sum(idx_blks_hit) + sum(idx_blks_read), 0) * 100, 2))
      FROM pg_statio_user_indexes WHERE schemaname = current_schema())),
  'deadTuples', COALESCE((SELECT jsonb_agg(jsonb_build_object('schema', schemaname, 'table', relname,
      'deadTuples', n_dead_tup, 'liveTuples', n_live_tup,
      'deadPercentage', round(n_dead_tup::numeric / NULLIF(n_live_tup, 0) * 100, 2),
      'lastVacuum', to_char(last_vacuum AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
      'lastAutovacuum', to_char(last_autovacuum AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')) ORDER BY n_dead_tup DESC)
    FROM (SELECT * FROM pg_stat_user_tables WHERE schemaname = current_schema() AND n_dead_tup > 0
          ORDER BY n_dead_tup DESC LIMIT 15) d), '[]'::jsonb),
  'hotUpdates', COALESCE((SELECT jsonb_agg(jsonb_build_object('schema', schemaname, 'table', relname,
      'totalUpdates', n_tup_upd, 'hotUpdates', n_tup_hot_upd,
      'hotUpdatePercentage', round(n_tup_hot_upd::numeric / NULLIF(n_tup_upd, 0) * 100, 2)) ORDER BY n_tup_upd DESC)
    FROM (SELECT * FROM pg_stat_user_tables WHERE schemaname = current_schema() AND n_tup_upd > 0
          ORDER BY n_tup_upd DESC LIMIT 15) h), '[]'::jsonb),
  'activeQueries', COALESCE((SELECT jsonb_agg(jsonb_build_object('pid', pid,
      'duration', extract(epoch FROM now() - query_start), 'state', state, 'query', left(query, 200),
      'waitEventType', wait_event_type, 'waitEvent', wait_event) ORDER BY query_start)
    FROM (SELECT * FROM pg_stat_activity WHERE datname = current_database() AND state <> 'idle'
            AND query_start < now() - interval '1 second' AND pid <> pg_backend_pid()
          ORDER BY query_start LIMIT 10) a), '[]'::jsonb),
  'autovacuumStatus', COALESCE((SELECT jsonb_agg(jsonb_build_object('table', relname,
      'lastAutovacuum', to_char(last_autovacuum AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
      'deadTuples', n_dead_tup, 'autovacuumCount', autovacuum_count, 'autoanalyzeCount', autoanalyze_count) ORDER BY n_dead_tup DESC)
    FROM (SELECT * FROM pg_stat_user_tables WHERE schemaname = current_schema() AND n_dead_tup > 1000
          ORDER BY n_dead_tup DESC LIMIT 10) v), '[]'::jsonb),
  'bufferConfig', COALESCE((SELECT jsonb_build_object('sharedBuffers', setting,
      'sharedBuffersSize', pg_size_pretty(setting::bigint * 8192)) FROM pg_settings WHERE name = 'shared_buffers'), '{}'::jsonb),
  'bufferUsage', '[]'::jsonb,
  'tableSizes', COALESCE((SELECT jsonb_agg(jsonb_build_object('table', relname,
      'totalSize', pg_size_pretty(total), 'totalSizeBytes', total,
      'tableSize', pg_size_pretty(heap), 'tableSizeBytes', heap,
      'indexSize', pg_size_pretty(idx), 'indexSizeBytes', idx) ORDER BY total DESC)
    FROM (SELECT c.relname, pg_total_relation_size(c.oid) AS total, pg_relation_size(c.oid) AS heap,
                 pg_indexes_size(c.oid) AS idx
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = current_schema() AND c.relkind = 'r'
          ORDER BY pg_total_relation_size(c.oid) DESC LIMIT 20) z), '[]'::jsonb))`

// PostgresStats is PostgreSQL's view of Herald's tables as one JSON
// document (the shape of the reference server's postgres-stats: cache
// hit ratios, dead rows, HOT updates, sizes, statements running over a
// second). One statement over the statistics views.
func (s *Store) PostgresStats(ctx context.Context) (json.RawMessage, error) {
	var doc json.RawMessage
	if err := s.pool.QueryRow(ctx, postgresStatsSQL).Scan(&doc); err != nil {
		return nil, fmt.Errorf("reading postgres stats: %w", err)
	}
	return doc, nil
}
