package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// Every statement that locks several consumer rows (or
// partition rows) takes them in key order, as pushes and acks do, or two of
// them each hold a row the other waits for until PostgreSQL breaks the
// deadlock (40P01) and one request fails. Retention's cursor moves and
// ExtendLease / ReleaseLease by lease id updated their rows in scan order.
//
// lockOrderCase checks one statement over consumer rows without waiting
// for a deadlock's luck: the row with the smallest key is moved physically
// last (so a scan reaches it last) and held; the statement runs and must
// wait for it; while it waits, it must hold none of the other rows (a
// statement that locks in key order has not reached them yet).
type lockOrderCase struct {
	keys   []string // WHERE clauses of the rows the statement locks
	marker string   // the statement's "-- herald:" name, to find it waiting
	run    func(ctx context.Context) error
}

func (c lockOrderCase) check(t *testing.T, s *queue.Store) {
	t.Helper()
	ctx := ctxT(t)
	require.GreaterOrEqual(t, len(c.keys), 3, "the case needs rows to take out of order")
	first := c.keys[0]
	// Delete and insert again: the row gets the last heap position and the
	// last place among equal keys of every index. Its partition's row is
	// rewritten too, so a plan that walks partitions reaches it last.
	tx, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	for _, sql := range []string{
		`CREATE TEMP TABLE moved ON COMMIT DROP AS SELECT * FROM consumers WHERE ` + first,
		`UPDATE partitions SET last_offset = last_offset WHERE id = (SELECT partition_id FROM moved)`,
		`DELETE FROM consumers WHERE ` + first,
		`INSERT INTO consumers SELECT * FROM moved`,
	} {
		_, err = tx.Exec(ctx, sql)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))

	hold, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(context.Background()) }()
	var n int
	require.NoError(t, hold.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM consumers WHERE `+first+` FOR UPDATE) x`).Scan(&n))
	require.Equal(t, 1, n)

	done := make(chan error, 1)
	go func() { done <- c.run(ctx) }()
	waiting := func() bool {
		var n int
		err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE $1`, "%herald:"+c.marker+"%").Scan(&n)
		return err == nil && n == 1
	}
	require.Eventually(t, waiting, 10*time.Second, time.Millisecond, "%s waits for the row held", c.marker)
	var heldOutOfOrder []string
	for _, k := range c.keys[1:] {
		_, err := s.Pool().Exec(ctx, `SELECT 1 FROM consumers WHERE `+k+` FOR UPDATE NOWAIT`)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			heldOutOfOrder = append(heldOutOfOrder, k)
			continue
		}
		require.NoError(t, err)
	}
	require.NoError(t, hold.Commit(ctx))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not finish once the row was free", c.marker)
	}
	require.Empty(t, heldOutOfOrder, "%s held rows above %s while it waited for it: it locks out of key order",
		c.marker, first)
}

// spanningLease pops one message from each of n partitions of queue q
// under one lease and returns the lease id and the consumer rows' keys in
// key order.
func spanningLease(t *testing.T, s *queue.Store, q string, n int) (lease string, keys []string) {
	t.Helper()
	for i := range n {
		push(t, s, q, fmt.Sprint("p", i), nums(1, 2)...)
	}
	res := pop(t, s, queue.PopRequest{Queue: q, Partitions: n, Batch: 2 * n})
	require.Len(t, res.Messages, 2*n)
	var pids []string
	for _, m := range res.Messages {
		require.Equal(t, res.Messages[0].LeaseID, m.LeaseID, "one lease over every partition")
		pids = append(pids, m.PartitionID)
	}
	slices.Sort(pids)
	for _, pid := range slices.Compact(pids) {
		keys = append(keys, fmt.Sprintf("partition_id = '%s' AND consumer_group = '%s'", pid, queue.DefaultGroup))
	}
	return res.Messages[0].LeaseID, keys
}

func TestExtendLease_LocksInKeyOrder(t *testing.T) {
	s := newStore(t)
	lease, keys := spanningLease(t, s, "q", 4)
	lockOrderCase{keys: keys, marker: "extend_lease", run: func(ctx context.Context) error {
		res, err := s.ExtendLease(ctx, lease, 60, "")
		if err == nil && !res.Success {
			err = fmt.Errorf("not extended: %s", res.Error)
		}
		return err
	}}.check(t, s)
}

func TestReleaseLease_LocksInKeyOrder(t *testing.T) {
	s := newStore(t)
	lease, keys := spanningLease(t, s, "q", 4)
	lockOrderCase{keys: keys, marker: "release_lease", run: func(ctx context.Context) error {
		return s.ReleaseLease(ctx, lease)
	}}.check(t, s)
	var leased int
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM consumers WHERE lease_id IS NOT NULL`).Scan(&leased))
	require.Zero(t, leased, "the lease is released on every partition")
}

// groupKeys registers groups on queue q (partitions p0..p{n-1} with two
// messages each) and returns their consumer rows' keys in key order.
func groupKeys(t *testing.T, s *queue.Store, q string, n int, groups ...string) []string {
	t.Helper()
	for i := range n {
		push(t, s, q, fmt.Sprint("p", i), nums(1, 2)...)
	}
	var targets []queue.Target
	for _, g := range groups {
		targets = append(targets, queue.Target{Queue: q, Group: g})
	}
	require.NoError(t, s.EnsureConsumers(ctxT(t), targets))
	rows, err := s.Pool().Query(ctxT(t), `SELECT format('partition_id = %L AND consumer_group = %L', partition_id, consumer_group)
		FROM consumers ORDER BY partition_id, consumer_group`)
	require.NoError(t, err)
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		keys = append(keys, k)
	}
	require.NoError(t, rows.Err())
	return keys
}

func TestRetention_CursorsLockInKeyOrder(t *testing.T) {
	s := newStore(t)
	keys := groupKeys(t, s, "q", 3, "a", "b")
	// Retention took every partition's first message.
	exec(t, s, `DELETE FROM messages WHERE seq = 1`)
	var pids []string
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT array_agg(id::text ORDER BY id) FROM partitions`).Scan(&pids))
	lockOrderCase{keys: keys, marker: "retention_cursors", run: func(ctx context.Context) error {
		// On tables this small the planner walks the partitions by id and
		// the rows by key, in order by chance; with more partitions it
		// scans. Scans here, so the order does not hang on the plan.
		conn, err := s.Pool().Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		if _, err := conn.Exec(ctx, `SET enable_indexscan = off; SET enable_bitmapscan = off`); err != nil {
			return err
		}
		defer func() { _, _ = conn.Exec(context.Background(), `RESET enable_indexscan; RESET enable_bitmapscan`) }()
		_, err = conn.Exec(ctx, queue.RetentionCursorsSQL, pids)
		return err
	}}.check(t, s)
	var behind int
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM consumers WHERE cursor <> 1`).Scan(&behind))
	require.Zero(t, behind, "every cursor moved past the deleted offset")
}

func TestRetention_DonePrefixLocksInKeyOrder(t *testing.T) {
	s := newStore(t)
	keys := groupKeys(t, s, "q", 3, "a", "b")
	// maxWait marked the first offset done.
	exec(t, s, `UPDATE consumers SET done = '{1}'`)
	lockOrderCase{keys: keys, marker: "retention_done_prefix", run: func(ctx context.Context) error {
		_, err := s.Pool().Exec(ctx, queue.DonePrefixSQL)
		return err
	}}.check(t, s)
	var behind int
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM consumers WHERE cursor <> 1 OR done <> '{}'`).Scan(&behind))
	require.Zero(t, behind, "every cursor moved over the done offset")
}

// Idle partitions are deleted in id order, skipping one a push holds: that
// one is not idle (the push bumps its last_push_at), and waiting for it
// while holding others deadlocked with a multi-partition push.
func TestRetention_PartitionCleanupLocksInKeyOrder(t *testing.T) {
	s := newStore(t)
	for i := range 4 {
		push(t, s, "q", fmt.Sprint("p", i), 1)
	}
	exec(t, s, `DELETE FROM messages`)
	exec(t, s, `UPDATE partitions SET last_push_at = now() - interval '1 hour', created_at = now() - interval '1 hour'`)
	rows, err := s.Pool().Query(ctxT(t), `SELECT format('id = %L', id) FROM partitions ORDER BY id`)
	require.NoError(t, err)
	var keys []string
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		keys = append(keys, k)
	}
	require.NoError(t, rows.Err())
	first := keys[0]
	hold, err := s.Pool().Begin(ctxT(t))
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(context.Background()) }()
	_, err = hold.Exec(ctxT(t), `SELECT 1 FROM partitions WHERE `+first+` FOR NO KEY UPDATE`)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := s.Pool().Exec(ctxT(t), queue.CleanPartitionsSQL, 60)
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("partition cleanup waits for a partition a push holds")
	}
	require.NoError(t, hold.Commit(ctxT(t)))
	var left []string
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT coalesce(array_agg(format('id = %L', id)), '{}') FROM partitions`).Scan(&left))
	require.Equal(t, []string{first}, left, "the idle partitions went, the held one stayed")
}

// A transaction's acks lock their consumer rows in key order, with the
// rows its pushes write, before any operation runs: run one by one in the
// order the client listed them, acks of [p3, p2, p1, p0] held p3..p1 while
// waiting for p0, and ExtendLease of a lease over them (p0 first) could
// deadlock with it.
func TestTransaction_AcksLockInKeyOrder(t *testing.T) {
	s := newStore(t)
	for i := range 4 {
		push(t, s, "txq", fmt.Sprint("p", i), nums(1, 1)...)
	}
	res := pop(t, s, queue.PopRequest{Queue: "txq", Partitions: 4, Batch: 4})
	require.Len(t, res.Messages, 4)
	msgs := slices.Clone(res.Messages)
	slices.SortFunc(msgs, func(a, b queue.Message) int { return strings.Compare(a.PartitionID, b.PartitionID) })
	var keys []string
	var ops []queue.TxOp
	for _, m := range msgs {
		keys = append(keys, fmt.Sprintf("partition_id = '%s' AND consumer_group = '%s'", m.PartitionID, queue.DefaultGroup))
	}
	for _, m := range slices.Backward(msgs) {
		ops = append(ops, queue.TxOp{Type: "ack", Ack: queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID,
			LeaseID: m.LeaseID, Status: queue.StatusCompleted}})
	}
	ops = append(ops, queue.TxOp{Type: "push", Items: []queue.PushItem{{Queue: "txq", Partition: "p9", Payload: json.RawMessage(`1`)}}})
	// marker "": on the code before, the statement left waiting was an
	// ack's own lock, after it had taken the rows above.
	lockOrderCase{keys: keys, marker: "", run: func(ctx context.Context) error {
		r, err := s.Transaction(ctx, ops, nil, "")
		if err == nil && !r.Success {
			err = fmt.Errorf("transaction failed: %s", r.Error)
		}
		return err
	}}.check(t, s)
}

// The transaction's consumer-row lock finds its rows through the primary
// key, whatever the size of the table (its OR used to read every consumer
// row of every queue).
func TestTransaction_LockReadsNoWholeTable(t *testing.T) {
	s := newStore(t)
	fillPartitions(t, s, "big", 5000)
	require.NoError(t, s.EnsureConsumers(ctxT(t), []queue.Target{{Queue: "big"}}))
	exec(t, s, "ANALYZE consumers")
	var pid string
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT id::text FROM partitions LIMIT 1`).Scan(&pid))
	plan := explain(t, s, queue.TxLockConsumersSQL, []string{pid}, []string{pid}, []string{queue.DefaultGroup})
	text, err := json.Marshal(plan)
	require.NoError(t, err)
	assert.NotContains(t, string(text), `"Seq Scan"`, "%s", text)
	assert.Less(t, plan["Shared Hit Blocks"].(float64)+plan["Shared Read Blocks"].(float64), 60.0, "%s", text)
}
