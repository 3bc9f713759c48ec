package pgnotify_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/server/servertest"
	"github.com/heraldmq/herald/pgnotify"
	"github.com/heraldmq/herald/queue"
)

// A maintenance switch's NOTIFY reaches another instance's listener as
// OnState (not as a wake-up), and so does every (re)connect.
func TestListener_OnState(t *testing.T) {
	require.Equal(t, queue.StateNotifyPayload, pgnotify.StatePayload, "the writer and the listener agree")
	dsn := servertest.SharedDSN(t)
	writer, err := queue.NewPool(context.Background(), dsn, 0)
	require.NoError(t, err)
	t.Cleanup(writer.Close)
	store, err := queue.New(queue.Config{Pool: writer})
	require.NoError(t, err)
	pool, err := queue.NewPool(context.Background(), dsn, 0)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	states := make(chan struct{}, 10)
	w := &recordingWaker{}
	ls, err := pgnotify.NewListener(pgnotify.ListenerConfig{Pool: pool, Waker: w,
		OnState: func() { states <- struct{}{} }})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = ls.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	receive := func(why string) {
		t.Helper()
		select {
		case <-states:
		case <-time.After(5 * time.Second):
			t.Fatal(why)
		}
	}
	receive("OnState after connecting")
	_, err = store.SetSystemFlag(context.Background(), queue.StateMaintenance, true)
	require.NoError(t, err)
	receive("OnState for the switch")
	wakes, _ := w.seen()
	assert.Empty(t, wakes, "a switch wakes no queue")
}
