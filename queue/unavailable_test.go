package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// IsUnavailable tells a database that cannot be reached or stopped
// answering (real failures: a refused dial, a connection cut mid-session,
// a backend terminated, a frozen server past the deadline) from one that
// refused the request or a caller that gave up.
func TestIsUnavailable_TellsAnOutageFromARefusal(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	refused, err := pgxpool.New(ctx, fmt.Sprintf("postgres://nobody@127.0.0.1:%d/nodb?sslmode=disable", port))
	require.NoError(t, err)
	defer refused.Close()
	_, err = refused.Exec(ctx, "SELECT 1")
	assert.True(t, queue.IsUnavailable(err), "refused dial: %v", err)

	proxy, dsn := pgtest.NewProxy(t, pgtest.DSN(t))
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	proxy.CutAll()
	_, err = conn.Exec(ctx, "SELECT 1")
	conn.Release()
	assert.True(t, queue.IsUnavailable(err), "connection cut: %v", err)

	proxy.Freeze()
	fctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = pool.Exec(fctx, "SELECT 1")
	cancel()
	proxy.Thaw()
	assert.True(t, queue.IsUnavailable(err), "frozen server past the deadline: %v", err)

	victim, err := pgxpool.New(ctx, pgtest.DSN(t))
	require.NoError(t, err)
	defer victim.Close()
	vc, err := victim.Acquire(ctx)
	require.NoError(t, err)
	pid := vc.Conn().PgConn().PID()
	_, err = pgtest.Pool(t).Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	_, err = vc.Exec(ctx, "SELECT 1")
	vc.Release()
	assert.True(t, queue.IsUnavailable(err), "backend terminated: %v", err)

	_, err = pgtest.Pool(t).Exec(ctx, "SELECT 1/0")
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr))
	assert.False(t, queue.IsUnavailable(err), "a statement the server refused: %v", err)
	assert.False(t, queue.OutcomeUnknown(err), "a refused statement did not commit")
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = pgtest.Pool(t).Exec(cctx, "SELECT 1")
	assert.False(t, queue.IsUnavailable(err), "the caller gave up: %v", err)
	assert.False(t, queue.IsUnavailable(nil))
}

// A backend that ends with a FATAL error (pg_terminate_backend, a
// shutdown) may have committed the statement it answers so: its outcome is
// unknown, unlike a statement the server refused.
func TestOutcomeUnknown_ATerminatedBackendMayHaveCommitted(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	victim, err := pgxpool.New(ctx, pgtest.DSN(t))
	require.NoError(t, err)
	defer victim.Close()
	vc, err := victim.Acquire(ctx)
	require.NoError(t, err)
	_, err = pgtest.Pool(t).Exec(ctx, "SELECT pg_terminate_backend($1)", vc.Conn().PgConn().PID())
	require.NoError(t, err)
	_, err = vc.Exec(ctx, "SELECT 1")
	vc.Release()
	require.Error(t, err)
	assert.True(t, queue.OutcomeUnknown(err), "backend terminated: %v", err)

	assert.True(t, queue.OutcomeUnknown(fmt.Errorf("popping: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01"})))
	assert.False(t, queue.OutcomeUnknown(&pgconn.PgError{Severity: "ERROR", Code: "40001"}), "refused: rolled back")
	assert.False(t, queue.OutcomeUnknown(nil))
}

// A pop transaction, or an ack, whose COMMIT reached the server but whose
// answer was lost has an unknown outcome (pgx calls the lost answer of a
// simple-protocol COMMIT "conn closed", safe to retry, as if it had never
// been sent): the pop's lease (its PopRequest.LeaseID) is there, to be
// given back; the ack is applied.
func TestOutcomeUnknown_ALostCommitMayHaveCommitted(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	proxy, dsn := pgtest.NewProxy(t, pgtest.DSN(t))
	s := queuetest.NewStoreDSN(t, dsn)
	push := func(n int) {
		items := make([]queue.PushItem, n)
		for i := range items {
			items[i] = queue.PushItem{Queue: "c", Partition: "p", Payload: json.RawMessage(`{}`)}
		}
		_, err := s.Push(ctx, items)
		require.NoError(t, err)
	}
	push(1)
	first, err := s.Pop(ctx, queue.PopRequest{Queue: "c"}) // registers the group, in a transaction of its own
	require.NoError(t, err)
	require.Len(t, first.Messages, 1)
	f := first.Messages[0]
	_, err = s.Ack(ctx, []queue.Ack{{TransactionID: f.TransactionID, PartitionID: f.PartitionID, LeaseID: f.LeaseID,
		Status: queue.StatusCompleted}})
	require.NoError(t, err)
	push(1)

	leaseID := queue.NewID()
	cut := proxy.CutAnswer("commit")
	_, err = s.Pop(ctx, queue.PopRequest{Queue: "c", Batch: 10, LeaseID: leaseID})
	<-cut
	require.Error(t, err)
	assert.True(t, queue.OutcomeUnknown(err), "a pop whose COMMIT's answer was lost: %v", err)
	again, err := s.Pop(ctx, queue.PopRequest{Queue: "c", Batch: 10})
	require.NoError(t, err)
	assert.Empty(t, again.Messages, "the lost pop committed its lease")
	require.NoError(t, s.ReleaseLease(ctx, leaseID))
	again, err = s.Pop(ctx, queue.PopRequest{Queue: "c", Batch: 10})
	require.NoError(t, err)
	require.Len(t, again.Messages, 1, "given back")
	assert.Zero(t, again.Messages[0].RetryCount)

	m := again.Messages[0]
	cut = proxy.CutAnswer("COMMIT")
	_, err = s.Ack(ctx, []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID,
		Status: queue.StatusCompleted}})
	<-cut
	require.Error(t, err)
	assert.True(t, queue.OutcomeUnknown(err), "an ack whose COMMIT's answer was lost: %v", err)
	res, err := s.Ack(ctx, []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID,
		Status: queue.StatusCompleted}})
	require.NoError(t, err)
	assert.True(t, res[0].Success, "a repeat of a committed ack succeeds: %+v", res[0])
}
