package queue_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newStore returns a migrated Store in a schema of its own.
func newStore(t testing.TB) *queue.Store { return queuetest.NewStore(t) }

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// ctxBig is the ceiling of tests that fill 20,000 partitions to read a
// plan: what they assert is the plan's shape, never its time, and on a
// busy 2-core machine (load 8) registering a group over 100,000
// partitions alone took more than ctxT's 30 s.
func ctxBig(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func push(t testing.TB, s *queue.Store, q, part string, payloads ...any) []queue.PushResult {
	t.Helper()
	items := make([]queue.PushItem, len(payloads))
	for i, p := range payloads {
		b, err := json.Marshal(p)
		require.NoError(t, err)
		items[i] = queue.PushItem{Queue: q, Partition: part, Payload: b}
	}
	res, err := s.Push(ctxT(t), items)
	require.NoError(t, err)
	return res
}

func pop(t testing.TB, s *queue.Store, req queue.PopRequest) *queue.PopResult {
	t.Helper()
	res, err := s.Pop(ctxT(t), req)
	require.NoError(t, err)
	return res
}

func ackAll(t testing.TB, s *queue.Store, res *queue.PopResult, status queue.AckStatus) []queue.AckResult {
	t.Helper()
	acks := make([]queue.Ack, len(res.Messages))
	for i, m := range res.Messages {
		acks[i] = queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID, Status: status, Group: m.Group}
	}
	out, err := s.Ack(ctxT(t), acks)
	require.NoError(t, err)
	return out
}

// payloads decodes {"n": k} payloads of delivered messages.
func payloads(t testing.TB, msgs []queue.Message) []int {
	t.Helper()
	out := make([]int, len(msgs))
	for i, m := range msgs {
		var v struct{ N int }
		require.NoError(t, json.Unmarshal(m.Data, &v))
		out[i] = v.N
	}
	return out
}

func nums(from, to int) []any {
	var out []any
	for i := from; i <= to; i++ {
		out = append(out, map[string]int{"n": i})
	}
	return out
}

func ints(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// exec runs SQL in the store's schema; tests use it to move time (expire a
// lease, age a message) instead of sleeping.
func exec(t testing.TB, s *queue.Store, sql string, args ...any) {
	t.Helper()
	_, err := s.Pool().Exec(ctxT(t), sql, args...)
	require.NoError(t, err)
}

// storeOnOneConnection is a store in a schema of its own whose pool (made
// by ParsePoolConfig, then adjust unless nil) has one connection: every statement on
// the same backend.
func storeOnOneConnection(t *testing.T, adjust func(*pgxpool.Config)) (*queue.Store, *pgxpool.Pool) {
	t.Helper()
	ctx := ctxT(t)
	cfg, err := queue.ParsePoolConfig(pgtest.DSN(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	if adjust != nil {
		adjust(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = queue.Migrate(ctx, pool)
	require.NoError(t, err)
	s, err := queue.New(queue.Config{Pool: pool})
	require.NoError(t, err)
	return s, pool
}
