package queue_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// A group's registration scanned every stored offset of
// every partition for gaps (registering over 1,000,000 messages took 1 s,
// with the partitions share-locked, so pushes waited). It reads the
// recorded holes instead, whatever the partition holds: here no plan node
// over messages returns more than a couple of rows (the first remaining
// message; the last before the subscription's start), on a partition of
// 20,000 messages with 20 holes. Seeks and group resets, which place
// cursors the same way, too.
func TestRegister_ReadsNoMessagePerOffset(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	push(t, s, "big", "", 1)
	const n = 20000
	exec(t, s, `INSERT INTO messages (partition_id, seq, id, transaction_id, payload, queue_id, follow_xid)
		SELECT p.id, g, gen_random_uuid(), 't' || g, '1', p.queue_id, pg_current_xact_id() FROM partitions p, generate_series(2, $1) g`, n)
	exec(t, s, `UPDATE partitions SET last_offset = $1`, n)
	exec(t, s, `WITH d AS (DELETE FROM messages WHERE seq % 1000 = 0 RETURNING partition_id, seq)
		INSERT INTO message_holes SELECT partition_id, seq FROM d`)
	exec(t, s, `ANALYZE messages`)
	var qid string
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT id::text FROM queues WHERE name = 'big'`).Scan(&qid))

	for _, now := range []bool{false, true} {
		tx, err := s.Pool().Begin(ctx)
		require.NoError(t, err)
		var plan []map[string]any
		require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+queue.GroupRegisterSQL,
			[]string{qid}, []string{"late"}, []bool{now}, []*time.Time{nil}).Scan(&plan))
		var cursor int64
		var done []int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT cursor, done FROM consumers WHERE consumer_group = 'late'`).Scan(&cursor, &done))
		require.NoError(t, tx.Rollback(ctx))
		read := messageRows(plan[0]["Plan"].(map[string]any))
		assert.LessOrEqual(t, read, 2.0, "subscribe-now %v: rows read from messages", now)
		if now {
			assert.EqualValues(t, n, cursor, "subscribe-now %v", now)
			assert.Empty(t, done)
		} else {
			assert.Zero(t, cursor, "subscribe-now %v", now)
			assert.Len(t, done, n/1000, "subscribe-now %v: the holes are done", now)
		}
	}

	// A seek back to the beginning and a group reset place cursors the
	// same way.
	require.NoError(t, s.EnsureConsumers(ctx, []queue.Target{{Queue: "big", Group: "late"}}))
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{
		"seek":  {queue.SeekSQL, []any{"late", "big", new(time.Time), ""}},
		"reset": {queue.GroupResetSQL, []any{"late", []string{qid}}},
	} {
		tx, err := s.Pool().Begin(ctx)
		require.NoError(t, err)
		var plan []map[string]any
		require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+q.sql, q.args...).Scan(&plan))
		var cursor int64
		var done []int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT cursor, done FROM consumers WHERE consumer_group = 'late'`).Scan(&cursor, &done))
		require.NoError(t, tx.Rollback(ctx))
		assert.LessOrEqual(t, messageRows(plan[0]["Plan"].(map[string]any)), 3.0, "%s: rows read from messages", name)
		assert.Zero(t, cursor, name)
		assert.Len(t, done, n/1000, "%s: the holes are done", name)
	}
}

// messageRows sums the rows plan nodes over the messages table returned
// (per loop times loops).
func messageRows(node map[string]any) float64 {
	var n float64
	if node["Relation Name"] == "messages" {
		n += node["Actual Rows"].(float64) * node["Actual Loops"].(float64)
	}
	if kids, ok := node["Plans"].([]any); ok {
		for _, k := range kids {
			n += messageRows(k.(map[string]any))
		}
	}
	return n
}

// partitionHoles lists the recorded holes of queue q's partitions.
func partitionHoles(t *testing.T, s *queue.Store, q string) []int64 {
	t.Helper()
	var out []int64
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT coalesce(array_agg(h.seq ORDER BY h.seq), '{}')
		FROM message_holes h JOIN partitions p ON p.id = h.partition_id JOIN queues q ON q.id = p.queue_id
		WHERE q.name = $1`, q).Scan(&out))
	return out
}

// Completed retention records, with its delete, the offsets it takes from
// above the partition's first remaining message (a group registered later
// counts them as finished), and forgets those below it once the prefix
// goes: the table keeps only the holes between remaining messages.
func TestRetention_CompletedRecordsItsHoles(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	completedRetentionGap(t, s)
	assert.Equal(t, []int64{2}, partitionHoles(t, s, "cr"), "the offset taken from the middle is recorded")

	res := pop(t, s, queue.PopRequest{Queue: "cr", Group: "g", Batch: 10})
	require.Equal(t, []int{1, 3}, payloads(t, res.Messages))
	ackAll(t, s, res, queue.StatusCompleted)
	exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_id IS NOT NULL`)
	_, _, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	var left int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM messages`).Scan(&left))
	require.Zero(t, left)
	assert.Empty(t, partitionHoles(t, s, "cr"), "no hole is kept below the first remaining message")
}

// Holes below a partition's first remaining message are of no use (every
// position starts at or after it) and a run of retention forgets them,
// wherever they came from (two deleters racing may leave one behind).
func TestRetention_ForgetsHolesBelowTheFirstMessage(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "h", Options: json.RawMessage(`{"completedRetentionSeconds":3600}`)})
	require.NoError(t, err)
	push(t, s, "h", "", nums(1, 6)...)
	push(t, s, "h", "empty", 1)
	exec(t, s, `DELETE FROM messages WHERE seq IN (1, 2, 4) OR partition_id = (SELECT id FROM partitions WHERE name = 'empty')`)
	exec(t, s, `INSERT INTO message_holes SELECT id, 4 FROM partitions WHERE name <> 'empty'`)
	exec(t, s, `INSERT INTO message_holes SELECT id, 1 FROM partitions`)
	_, ran, err := s.RunRetention(ctx, 0)
	require.NoError(t, err)
	require.True(t, ran)
	assert.Equal(t, []int64{4}, partitionHoles(t, s, "h"), "only the hole above the first remaining message (3) stays")
}

// The migration that makes completed retention record its holes records
// the gaps it left before: offsets with no message between remaining ones
// and after the last one.
func TestMigrate_RecordsExistingGaps(t *testing.T) {
	s := newStore(t)
	push(t, s, "m", "", nums(1, 8)...)
	exec(t, s, `DELETE FROM messages WHERE seq IN (1, 3, 4, 7, 8)`)
	migs, err := queue.Migrations()
	require.NoError(t, err)
	var sql string
	for _, m := range migs {
		if m.Version == 14 {
			sql = m.SQL
		}
	}
	require.NotEmpty(t, sql, "migration 14")
	_, err = s.Pool().Exec(context.Background(), sql)
	require.NoError(t, err)
	assert.Equal(t, []int64{3, 4, 7, 8}, partitionHoles(t, s, "m"))
}
