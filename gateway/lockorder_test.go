package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// doc.go's lock order: no store call runs under a gateway mutex. A stream
// that ends after Server.Close gives its leases back at once, and that
// release (a query) must not hold graceMu, which the resume-grace timers
// and every other closing stream take: a slow database would stall them
// all behind it.
func TestLockOrder_ReleaseAfterCloseHoldsNoLock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := testServer(t, nil)
	pushTo(t, s, "late", "a")
	res, err := s.store.Pop(ctx, queue.PopRequest{Queue: "late", Partition: "a", Batch: 1})
	require.NoError(t, err)
	require.Len(t, res.Messages, 1)
	require.NotEmpty(t, res.LeaseID)
	s.Close()

	// The lease's row, locked: the release waits on it.
	tx, err := s.store.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	var one int
	require.NoError(t, tx.QueryRow(ctx, `SELECT 1 FROM consumers WHERE lease_id = $1::uuid FOR UPDATE`, res.LeaseID).Scan(&one))
	var blocked int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
		AND query LIKE '%herald:release_lease%'`).Scan(&blocked))
	before := blocked

	released := make(chan struct{})
	go func() {
		defer close(released)
		s.releaseLater(chainRef{}, res.LeaseID, res.Messages)
	}()
	waitFor(t, func() bool {
		var n int
		err := s.store.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE '%herald:release_lease%'`).Scan(&n)
		return err == nil && n > before
	})
	locked := s.graceMu.TryLock()
	if locked {
		s.graceMu.Unlock()
	}
	assert.True(t, locked, "graceMu is free while the release waits on the database")

	require.NoError(t, tx.Rollback(ctx))
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("the release did not finish within 10 s of the row's unlock")
	}
	assert.Equal(t, 1, available(t, s, "late", "a"), "the lease was given back")
}
