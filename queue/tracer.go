package queue

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// QueryStats counts every statement sent through a pool made by NewPool or
// ParsePoolConfig, by operation. The operation is the name in the
// statement's leading "-- herald:<op>" comment, or else its first keyword
// (begin, commit, select, …). It is a pgx tracer, so no statement escapes it:
// queries, batch members, and the begin/commit of transactions.
type QueryStats struct {
	ops   sync.Map // op → *atomic.Uint64
	total atomic.Uint64
}

// Total is the number of statements sent so far.
func (q *QueryStats) Total() uint64 { return q.total.Load() }

// Snapshot returns the count per operation.
func (q *QueryStats) Snapshot() map[string]uint64 {
	out := map[string]uint64{}
	q.ops.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	return out
}

func (q *QueryStats) count(sql string) {
	op := opName(sql)
	c, ok := q.ops.Load(op)
	if !ok {
		c, _ = q.ops.LoadOrStore(op, new(atomic.Uint64))
	}
	c.(*atomic.Uint64).Add(1)
	q.total.Add(1)
}

// opName extracts the operation label of a statement; labels stay few
// (named statements plus SQL keywords), as metrics labels must.
func opName(sql string) string {
	s := strings.TrimSpace(sql)
	if rest, ok := strings.CutPrefix(s, "-- herald:"); ok {
		if i := strings.IndexAny(rest, " \t\r\n"); i > 0 {
			return rest[:i]
		}
		return rest
	}
	for strings.HasPrefix(s, "--") {
		_, s, _ = strings.Cut(s, "\n")
		s = strings.TrimSpace(s)
	}
	word := s
	if i := strings.IndexAny(s, " \t\r\n(;"); i >= 0 {
		word = s[:i]
	}
	switch w := strings.ToLower(word); w {
	case "select", "insert", "update", "delete", "with", "begin", "commit", "rollback", "create", "alter", "drop",
		"set", "listen", "notify", "unlisten", "savepoint", "release":
		return w
	}
	return "other"
}

// queryTracer feeds QueryStats from pgx's tracing hooks.
type queryTracer struct{ stats *QueryStats }

func (t queryTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	t.stats.count(data.SQL)
	return ctx
}

func (queryTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (queryTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (t queryTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	t.stats.count(data.SQL)
}

func (queryTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// QueryStats returns the statement counters of the store's pool, or nil when
// the pool was not made by NewPool or ParsePoolConfig.
func (s *Store) QueryStats() *QueryStats {
	if t, ok := s.pool.Config().ConnConfig.Tracer.(queryTracer); ok {
		return t.stats
	}
	return nil
}
