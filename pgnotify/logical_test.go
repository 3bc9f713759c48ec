package pgnotify_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/server/servertest"
	"github.com/heraldmq/herald/pgnotify"
	"github.com/heraldmq/herald/queue/queuetest"
)

// In logical mode a long-poll on B gets a message pushed through A, which
// sends no NOTIFY at all: the insert itself, read from the WAL, wakes B.
func TestLogical_CrossInstance(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a, b := servertest.Start(t, dsn, "none"), servertest.Start(t, dsn, "logical")
	// Each of 20 within 10 s, where the sweep is a minute: woken, not swept
	// (cmd/herald-bench cluster measures how fast).
	servertest.CrossLatency(t, a, b, "lq")

	// Any producer: a plain SQL call to the push function wakes B too.
	got := b.LongPoll("lq", 10*time.Second)
	_, err := a.Store().Pool().Exec(context.Background(), `SELECT push('lq', 'p9', '{"sql":1}', NULL)`)
	require.NoError(t, err)
	ans := servertest.Wait(t, got, 10*time.Second)
	require.Equal(t, http.StatusOK, ans.Status, ans.Body)
}

// The temporary slot disappears when the instance stops.
func TestLogical_SlotGoneAfterStop(t *testing.T) {
	store := queuetest.NewStore(t)
	l, err := pgnotify.NewLogical(pgnotify.LogicalConfig{Pool: store.Pool(), Tables: store, Waker: nopWaker{}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Run(ctx)
	}()
	select {
	case <-l.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("stream did not start")
	}
	slots := func() int {
		var n int
		require.NoError(t, store.Pool().QueryRow(context.Background(),
			`SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, l.Slot()).Scan(&n))
		return n
	}
	assert.Equal(t, 1, slots())
	cancel()
	<-done
	require.Eventually(t, func() bool { return slots() == 0 }, 10*time.Second, 10*time.Millisecond)
}

type nopWaker struct{}

func (nopWaker) Wake(string, string, string) {}
func (nopWaker) WakeAll(string)              {}
