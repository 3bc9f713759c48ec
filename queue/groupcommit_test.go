package queue_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// A push or an ack (group commits, run on behalf of every caller of their
// batch) on a database that hangs (a frozen primary) ends when its caller
// gives up, not after a detached timeout of its own: the client's request
// and Herald's answer agree, and the hung connection is let go. Once the
// database answers again, so do pushes.
func TestGroupCommit_EndsWhenItsCallersGiveUp(t *testing.T) {
	t.Parallel()
	proxy, dsn := pgtest.NewProxy(t, pgtest.DSN(t))
	s := queuetest.NewStoreDSN(t, dsn)
	item := []queue.PushItem{{Queue: "hang", Partition: "p", Payload: json.RawMessage(`{"n":1}`)}}
	push(t, s, "hang", "p", 0)
	got := pop(t, s, queue.PopRequest{Queue: "hang", Partition: "p", Batch: 1})
	require.Len(t, got.Messages, 1)
	m := got.Messages[0]

	proxy.Freeze()
	for name, call := range map[string]func(ctx context.Context) error{
		"Push": func(ctx context.Context) error { _, err := s.Push(ctx, item); return err },
		"Ack": func(ctx context.Context) error {
			_, err := s.Ack(ctx, []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID,
				Status: queue.StatusCompleted, Group: m.Group}})
			return err
		},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		start := time.Now()
		err := call(ctx)
		took := time.Since(start)
		cancel()
		require.Error(t, err, name)
		assert.True(t, queue.IsUnavailable(err), "%s: %v", name, err)
		t.Logf("%s on a frozen database: failed after %v", name, took)
		assert.Less(t, took, 5*time.Second, "%s ends with its caller (500 ms), not after a detached timeout", name)
	}
	proxy.Thaw()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := s.Push(ctx, item)
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "pushes come back with the database")
}
