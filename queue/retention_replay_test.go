package queue_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// Issue 16, point 5: completed retention decided which messages every
// group had finished on the snapshot its delete statement started with. A
// dead letter replayed while that statement scanned (its message pending
// for its group again, committed before the scan reached the message) was
// deleted all the same, and the group waited on that offset. Retention now
// locks its victims first and deletes only those still finished by every
// group when it deletes, read after its locks: a replay that commits
// before that is seen, one that commits after waited for the lock and
// finds the message gone (message_gone).
func TestIssue16_RetentionKeepsAMessageReplayedMeanwhile(t *testing.T) {
	// Three rounds where the replay wins the race: alone, one fails on the
	// old statement about every other time.
	replayed := 0
	for round := 0; round < 10 && replayed < 3; round++ {
		if replayedMeanwhile(t, round) {
			replayed++
		}
	}
	require.Equal(t, 3, replayed, "rounds where the replay ran while retention scanned")
}

// replayedMeanwhile runs one round: retention scans many messages before
// the dead-lettered one while it is replayed. It reports whether the
// replay put the message back (else retention had taken it first, which is
// allowed, and the round proves nothing).
func replayedMeanwhile(t *testing.T, round int) bool {
	s := newStore(t)
	ctx := ctxT(t)
	// Many messages retention must look at before it reaches queue q's
	// (pushed first: a scan by heap or by partition meets them first),
	// which a group has not finished, so they stay.
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "bulk", Options: json.RawMessage(`{"completedRetentionSeconds":1}`)})
	require.NoError(t, err)
	require.NoError(t, s.EnsureConsumers(ctx, []queue.Target{{Queue: "bulk", Group: "b"}}))
	items := make([]queue.PushItem, 5000)
	for range 8 {
		for i := range items {
			items[i] = queue.PushItem{Queue: "bulk", Payload: json.RawMessage(`1`)}
		}
		_, err := s.Push(ctx, items)
		require.NoError(t, err)
	}
	// Aged (older than completedRetentionSeconds), so that each one costs
	// retention its check of the groups. No VACUUM: q's messages, pushed
	// after, must not fill the space the old versions leave.
	age(t, s, "bulk", 0, len(items)*8, 3600)
	dlqFixture(t, s, 5, 2) // g dead-lettered offset 2; g and h finished the rest
	_, err = s.Configure(ctx, queue.ConfigureRequest{Queue: "q",
		Options: json.RawMessage(`{"retryLimit":0,"completedRetentionSeconds":1}`)})
	require.NoError(t, err)
	age(t, s, "q", 0, 5, 3600)
	exec(t, s, `ANALYZE messages`)
	id := rowIDs(t, deadLetters(t, s, "g")[2])

	ran := make(chan error, 1)
	go func() {
		_, _, err := s.RunRetention(ctx, 100000)
		ran <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		// The completed rule's scan (the statement with the LIMIT).
		err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE state = 'active'
			AND query LIKE '%herald:retention_%' AND query LIKE '%completed_retention_seconds > 0%'
			AND query LIKE '%LIMIT $1%'`).Scan(&n)
		return err == nil && n == 1
	}, 10*time.Second, 100*time.Microsecond, "completed retention runs")
	res, err := s.ReplayDeadLetters(ctx, queue.DLQSelection{IDs: id})
	require.NoError(t, err)
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("retention did not finish")
	}
	if res.Items[0].Status != queue.DLQReplayed {
		t.Logf("round %d: retention took the message first (%s)", round, res.Items[0].Reason)
		return false
	}
	var stored int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM messages m JOIN partitions p ON p.id = m.partition_id
		JOIN queues q ON q.id = p.queue_id WHERE q.name = 'q' AND m.seq = 2`).Scan(&stored))
	require.Equal(t, 1, stored, "round %d: retention deleted the message a replay put back", round)
	got := pop(t, s, queue.PopRequest{Queue: "q", Group: "g", Batch: 10})
	require.Equal(t, []int{2}, payloads(t, got.Messages), fmt.Sprintf("round %d: the replayed message is delivered", round))
	return true
}
