package queue_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// groupsOf returns each consumer group's row on partition part of q.
func groupsOf(t *testing.T, s *queue.Store, q, part string) map[string]queue.PartitionGroup {
	t.Helper()
	page, err := s.BrowsePartitions(ctxT(t), queue.PartitionsQuery{Queue: q, Search: part, Groups: true})
	require.NoError(t, err)
	out := map[string]queue.PartitionGroup{}
	for _, p := range page.Partitions {
		if p.Name == part {
			for _, g := range p.Groups {
				out[g.Group] = g
			}
		}
	}
	return out
}

// ready counts the consumer rows of q that consumers_ready lists (a group
// waits for something there): a row wrongly left there is a partition
// every pop claims and gets nothing from.
func ready(t *testing.T, s *queue.Store, q string) int {
	t.Helper()
	var n int
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM consumers c JOIN queues q ON q.id = c.queue_id
		WHERE q.name = $1 AND c.last_offset > c.cursor`, q).Scan(&n))
	return n
}

// A message deleted from the middle of a lease. Offsets are
// dense and cursors move only over finished offsets, so the deleted offset
// must count as finished for every group, now and later: the holder's
// other acks end the lease, the group goes on after it, a group that had
// not reached it skips it, and a group registered afterwards too.
func TestBrowse_DeleteMessageUnderALiveLease(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	push(t, s, "del", "p", nums(1, 6)...)
	require.NoError(t, s.EnsureConsumers(ctx, []queue.Target{{Queue: "del", Group: "bus"}}))
	a := pop(t, s, queue.PopRequest{Queue: "del", Partition: "p", Batch: 3})
	require.Equal(t, []int{1, 2, 3}, payloads(t, a.Messages))
	gone := a.Messages[1]

	res, err := s.DeleteMessage(ctx, gone.PartitionID, gone.TransactionID)
	require.NoError(t, err)
	assert.True(t, res.Message)
	assert.Equal(t, "del", res.Queue)
	assert.Equal(t, []queue.CoveredLease{{Group: queue.DefaultGroup, LeaseID: a.LeaseID}}, res.Leases,
		"the lease goes on: 1 and 3 are not acked")
	_, err = s.BrowseMessage(ctx, gone.PartitionID, gone.TransactionID)
	assert.ErrorIs(t, err, queue.ErrMessageNotFound)
	g := groupsOf(t, s, "del", "p")
	assert.Equal(t, int64(5), g[queue.DefaultGroup].Lag, "1 and 3 leased, 4, 5 and 6 waiting")
	assert.Equal(t, int64(5), g["bus"].Lag, "every message but the deleted one")

	acks := ackAll(t, s, a, queue.StatusCompleted)
	assert.True(t, acks[0].Success)
	assert.Equal(t, queue.ErrTextNotFound, acks[1].Error, "the holder's ack of the deleted message")
	assert.True(t, acks[2].Success)
	assert.True(t, acks[2].LeaseReleased, "1 and 3 acked: the deleted 2 counts as done, the lease ends")

	rest := pop(t, s, queue.PopRequest{Queue: "del", Partition: "p", Batch: 10})
	assert.Equal(t, []int{4, 5, 6}, payloads(t, rest.Messages))
	ackAll(t, s, rest, queue.StatusCompleted)
	bus := pop(t, s, queue.PopRequest{Queue: "del", Partition: "p", Group: "bus", Batch: 10})
	assert.Equal(t, []int{1, 3, 4, 5, 6}, payloads(t, bus.Messages), "a group that had not reached it skips it")
	ackAll(t, s, bus, queue.StatusCompleted)

	late := pop(t, s, queue.PopRequest{Queue: "del", Partition: "p", Group: "late", Batch: 10})
	assert.Equal(t, []int{1, 3, 4, 5, 6}, payloads(t, late.Messages), "a group registered after the delete")
	ackAll(t, s, late, queue.StatusCompleted)

	for name, row := range groupsOf(t, s, "del", "p") {
		assert.Equal(t, int64(6), row.Cursor, "%s: the cursor passed the deleted offset", name)
		assert.Zero(t, row.Done, name)
		assert.Zero(t, row.Lag, name)
	}
	assert.Zero(t, ready(t, s, "del"), "no row waits for the deleted offset")
	list, err := s.BrowseQueues(ctx, queue.QueuesQuery{Name: "del"})
	require.NoError(t, err)
	assert.Equal(t, queue.Counts{Total: 6, Completed: 6}, list.Queues[0].Counts)
}

// A message that was the last unfinished one of a lease ends it; a
// wildcard pop of one partition then serves the queue's other partition
// (a row left waiting for a deleted offset would be claimed by every such
// pop and give nothing).
func TestBrowse_DeleteTheLastUnfinishedMessageOfALease(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	push(t, s, "del", "a", nums(1, 1)...)
	a := pop(t, s, queue.PopRequest{Queue: "del", Batch: 1})
	require.Len(t, a.Messages, 1)
	push(t, s, "del", "b", nums(2, 2)...)

	res, err := s.DeleteMessage(ctx, a.Messages[0].PartitionID, a.Messages[0].TransactionID)
	require.NoError(t, err)
	require.Len(t, res.Leases, 1)
	assert.True(t, res.Leases[0].Released)
	assert.False(t, res.Leases[0].Pending)
	assert.Zero(t, groupsOf(t, s, "del", "a")[queue.DefaultGroup].Lag)

	for range 3 {
		b := pop(t, s, queue.PopRequest{Queue: "del", Batch: 1})
		if len(b.Messages) == 1 {
			assert.Equal(t, []int{2}, payloads(t, b.Messages))
			return
		}
	}
	t.Fatal("a wildcard pop did not reach partition b")
}

// Deleting the last unfinished message of a lease held by a group that
// was behind (pushes left its row's copy of last_offset alone): the lease
// ends, and the messages pushed meanwhile are reported pending.
func TestBrowse_DeleteEndingALeaseReportsMessagesPushedWhileTheGroupWasBehind(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	push(t, s, "del-behind", "", nums(1, 1)...)
	a := pop(t, s, queue.PopRequest{Queue: "del-behind", Group: "g", Batch: 1})
	require.Len(t, a.Messages, 1)
	push(t, s, "del-behind", "", nums(2, 3)...)

	res, err := s.DeleteMessage(ctx, a.Messages[0].PartitionID, a.Messages[0].TransactionID)
	require.NoError(t, err)
	require.Len(t, res.Leases, 1)
	assert.True(t, res.Leases[0].Released)
	assert.True(t, res.Leases[0].Pending, "messages 2 and 3 wait for the group")
	b := pop(t, s, queue.PopRequest{Queue: "del-behind", Group: "g", Batch: 10})
	assert.Equal(t, []int{2, 3}, payloads(t, b.Messages))
}

// Deleting the first or the last message: cursors move over it, and a
// group registered later (from the start or from now) starts caught up
// with what is gone.
func TestBrowse_DeleteTheFirstAndLastMessages(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	res := push(t, s, "del", "p", nums(1, 4)...)
	pid := res[0].PartitionID
	for _, i := range []int{0, 3} {
		_, err := s.DeleteMessage(ctx, pid, res[i].TransactionID)
		require.NoError(t, err)
	}
	all := pop(t, s, queue.PopRequest{Queue: "del", Group: "all", Batch: 10})
	assert.Equal(t, []int{2, 3}, payloads(t, all.Messages))
	ackAll(t, s, all, queue.StatusCompleted)
	_ = pop(t, s, queue.PopRequest{Queue: "del", Group: "new", SubscriptionMode: "new", Batch: 10})
	g := groupsOf(t, s, "del", "p")
	assert.Equal(t, queue.PartitionGroup{Group: "all", Cursor: 4, DeliveredTo: 3}, withoutTimes(g["all"]))
	assert.Equal(t, queue.PartitionGroup{Group: "new", Cursor: 4}, withoutTimes(g["new"]))
	assert.Zero(t, ready(t, s, "del"))

	var holes int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM message_holes`).Scan(&holes))
	assert.Equal(t, 1, holes, "only the offset between remaining messages is kept (4, not 1)")
}

func withoutTimes(g queue.PartitionGroup) queue.PartitionGroup {
	g.LeasedAt, g.Lease = nil, nil
	return g
}

// A message already gone (retention) whose dead letters remain: deleting
// it removes those; after that it is not found.
func TestBrowse_DeleteOnlyDeadLetters(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	push(t, s, "del", "p", nums(1, 2)...)
	m := pop(t, s, queue.PopRequest{Queue: "del", Batch: 1}).Messages[0]
	acks, err := s.Ack(ctx, []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID,
		Status: queue.StatusDLQ, Error: "bad"}})
	require.NoError(t, err)
	require.True(t, acks[0].Success)
	exec(t, s, `DELETE FROM messages WHERE transaction_id = $1`, m.TransactionID)

	d, err := s.BrowseMessage(ctx, m.PartitionID, m.TransactionID)
	require.NoError(t, err, "the dead-lettered copy is shown")
	assert.True(t, d.Removed)
	assert.Equal(t, queue.StateDeadLetter, d.State)
	assert.JSONEq(t, `{"n":1}`, string(d.Data))
	assert.Equal(t, "bad", *d.ErrorMessage)

	res, err := s.DeleteMessage(ctx, m.PartitionID, m.TransactionID)
	require.NoError(t, err)
	assert.False(t, res.Message)
	assert.Equal(t, int64(1), res.DeadLetters)
	_, err = s.DeleteMessage(ctx, m.PartitionID, m.TransactionID)
	assert.ErrorIs(t, err, queue.ErrMessageNotFound)
	_, err = s.DeleteMessage(ctx, queue.NewID(), "x")
	assert.ErrorIs(t, err, queue.ErrMessageNotFound, "an unknown partition")
}

// explainCustom runs sql as a browse does (planned for its parameters,
// see Store.browse) under EXPLAIN (ANALYZE, BUFFERS) and returns the
// plan's root. Arguments are literals; nil is NULL.
func explainCustom(t *testing.T, s *queue.Store, sql string, args ...any) map[string]any {
	t.Helper()
	return explainMode(t, s, "force_custom_plan", sql, args...)
}

// explainMode is explainCustom with plan_cache_mode mode: force_generic_plan
// shows the plan a pooled connection keeps for a statement it has run often.
func explainMode(t *testing.T, s *queue.Store, mode, sql string, args ...any) map[string]any {
	t.Helper()
	tx, err := s.Pool().Begin(ctxT(t))
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctxT(t), "SET LOCAL plan_cache_mode = "+mode)
	require.NoError(t, err)
	_, err = tx.Exec(ctxT(t), "PREPARE explained AS "+sql)
	require.NoError(t, err)
	defer func() { _, _ = tx.Exec(context.Background(), "DEALLOCATE explained") }()
	lits := make([]string, len(args))
	for i, a := range args {
		if a == nil {
			lits[i] = "NULL"
			continue
		}
		lits[i] = "'" + strings.ReplaceAll(fmt.Sprint(a), "'", "''") + "'"
	}
	var doc []map[string]any
	require.NoError(t, tx.QueryRow(ctxT(t), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE explained("+
		strings.Join(lits, ", ")+")").Scan(&doc))
	return doc[0]["Plan"].(map[string]any)
}

// blocks is the shared buffers a plan touched.
func blocks(plan map[string]any) int64 {
	hit, _ := plan["Shared Hit Blocks"].(float64)
	read, _ := plan["Shared Read Blocks"].(float64)
	return int64(hit + read)
}

// scans lists the tables that grow with partitions and messages which a
// plan reads whole (Seq Scan nodes). The others (queues, consumer groups,
// an empty dead_letters) fit a page or two: a scan is their best plan.
func scans(plan map[string]any) []string {
	var out []string
	switch rel := fmt.Sprint(plan["Relation Name"]); {
	case plan["Node Type"] == "Seq Scan" && (rel == "partitions" || rel == "consumers" || rel == "messages"):
		out = append(out, rel)
	}
	subs, _ := plan["Plans"].([]any)
	for _, sub := range subs {
		out = append(out, scans(sub.(map[string]any))...)
	}
	return out
}

// The queue list and one queue's figures count what a group waits for
// from the partitions' last offsets: a push leaves the row of a group that
// is behind alone (its copy of last_offset is a lower bound), so counting
// from the copy would leave out what was pushed meanwhile.
func TestBrowse_QueueCountsMessagesPushedWhileAGroupWasBehind(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	const q = "counts-behind"
	push(t, s, q, "", nums(1, 1)...)
	res := pop(t, s, queue.PopRequest{Queue: q, Batch: 1})
	require.Len(t, res.Messages, 1)
	push(t, s, q, "", nums(2, 3)...) // the default group is behind: its row keeps the copy 1
	want := queue.Counts{Total: 3, Pending: 2, Processing: 1}

	list, err := s.BrowseQueues(ctx, queue.QueuesQuery{Name: q})
	require.NoError(t, err)
	require.Len(t, list.Queues, 1)
	assert.Equal(t, want, list.Queues[0].Counts, "the queue list")
	scoped, err := s.BrowseQueues(ctx, queue.QueuesQuery{Name: q, Scope: &queue.Scope{Queues: []string{"^counts"}, Partitions: []string{".*"}}})
	require.NoError(t, err)
	require.Len(t, scoped.Queues, 1)
	assert.Equal(t, want, scoped.Queues[0].Counts, "the queue list, scoped")
	page, err := s.BrowsePartitions(ctx, queue.PartitionsQuery{Queue: q, Limit: 10})
	require.NoError(t, err)
	assert.Equal(t, want, page.Queue.Counts, "the queue's figures")
	page, err = s.BrowsePartitions(ctx, queue.PartitionsQuery{Queue: q, Limit: 10, Scope: &queue.Scope{Queues: []string{"^counts"}, Partitions: []string{".*"}}})
	require.NoError(t, err)
	assert.Equal(t, want, page.Queue.Counts, "the queue's figures, scoped")
}

// An operator console pages a queue of many partitions (20,000 prove the
// plans; 100,000 took minutes on a busy machine and proved nothing more)
// and reads its totals. The page reads an index range of partitions
// (queue_id, name) and a few rows per partition shown, whatever the
// queue's size; a keyset page as much; an offset page adds only index
// entries; the totals read the queue's own rows and never a message; and
// a small queue next to the big one reads only its own rows.
func TestBrowse_QueueReadStaysIndexBacked(t *testing.T) {
	s := newStore(t)
	ctx := ctxBig(t)
	const big = 20000
	fillPartitions(t, s, "big", big)
	fillPartitions(t, s, "small", 100)
	require.NoError(t, s.EnsureConsumers(ctx, []queue.Target{{Queue: "big"}, {Queue: "big", Group: "bus"}, {Queue: "small"}}))
	leased := pop(t, s, queue.PopRequest{Queue: "big", Partitions: 50, Batch: 50})
	require.Len(t, leased.Messages, 50)
	exec(t, s, "VACUUM ANALYZE")
	id := func(q string) string {
		id, err := s.QueueID(ctx, q)
		require.NoError(t, err)
		return id
	}
	bigID, smallID := id("big"), id("small")

	// One page of 100 partitions: the same work in both queues.
	smallPage := blocks(explainCustom(t, s, queue.BrowsePartitionsAllSQL, smallID, "small", "", "", 100, 0, nil, nil, nil))
	first := explainCustom(t, s, queue.BrowsePartitionsAllSQL, bigID, "big", "", "", 100, 0, nil, nil, nil)
	keyset := explainCustom(t, s, queue.BrowsePartitionsAllSQL, bigID, "big", "p15555", "", 100, 0, nil, nil, nil)
	offset := explainCustom(t, s, queue.BrowsePartitionsAllSQL, bigID, "big", "", "", 100, big/2, nil, nil, nil)
	t.Logf("a page of 100 partitions: %d blocks in a queue of 100; of %d: %d (first), %d (keyset), %d (offset half the queue)",
		smallPage, big, blocks(first), blocks(keyset), blocks(offset))
	for name, p := range map[string]map[string]any{"first": first, "keyset": keyset, "offset": offset} {
		assert.Empty(t, scans(p), "%s page: no table is scanned", name)
	}
	assert.LessOrEqual(t, blocks(first), smallPage*3/2+20, "the first page costs what it costs in a small queue")
	assert.LessOrEqual(t, blocks(keyset), smallPage*3/2+20, "a keyset page too")
	assert.LessOrEqual(t, blocks(offset), blocks(first)+big/2/3, "an offset page adds the index entries it skips")

	// The totals: the queue's own rows, no message.
	smallTotals := explainCustom(t, s, queue.QueueTotalsAllSQL, smallID, "small", nil, nil)
	bigTotals := explainCustom(t, s, queue.QueueTotalsAllSQL, bigID, "big", nil, nil)
	t.Logf("totals: %d blocks for 100 partitions (%v ms), %d for %d (%v ms); scans %v",
		blocks(smallTotals), smallTotals["Actual Total Time"], blocks(bigTotals), big, bigTotals["Actual Total Time"],
		scans(bigTotals))
	assert.Empty(t, scans(smallTotals), "a small queue's totals read its own rows by index")
	assert.Less(t, blocks(smallTotals), int64(200))
	assert.NotContains(t, scans(bigTotals), "messages")
	assert.Less(t, blocks(bigTotals), int64(big/5), "a fifth of a block per partition, at most")

	// And the reads answer.
	page, err := s.BrowsePartitions(ctx, queue.PartitionsQuery{Queue: "big", After: "p9990", Limit: 100, Groups: true})
	require.NoError(t, err)
	assert.Equal(t, int64(big), page.Matching)
	assert.Equal(t, int64(big), page.Queue.Partitions)
	assert.Equal(t, queue.Counts{Total: big, Pending: big, Processing: 50}, page.Queue.Counts, "each figure the group furthest behind for it")
	require.Len(t, page.Partitions, 9, "p9991 … p9999 (p99990 and above do not exist)")
	assert.Equal(t, "p9991", page.Partitions[0].Name)
	assert.Len(t, page.Partitions[0].Groups, 2)
}
