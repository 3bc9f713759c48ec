package queue_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// Herald's connections carry timeouts; the hot tables are tuned for
// autovacuum; the hygiene sample sees sizes, dead rows and a transaction
// holding the xmin horizon.
func TestHygiene(t *testing.T) {
	ctx := ctxT(t)
	s := newStore(t)
	var st, idle string
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT current_setting('statement_timeout'),
		current_setting('idle_in_transaction_session_timeout')`).Scan(&st, &idle))
	assert.Equal(t, "30s", st)
	assert.Equal(t, "1min", idle)
	var opts []string
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT reloptions FROM pg_class WHERE oid = 'consumers'::regclass`).Scan(&opts))
	assert.Contains(t, opts, "fillfactor=70")

	pushN(t, s, "hy", 50)
	_, err := s.Pool().Exec(ctx, `DELETE FROM messages WHERE seq <= 20`)
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `SELECT pg_stat_force_next_flush()`)
	require.NoError(t, err)

	// Another session keeps a snapshot open.
	tx, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT count(*) FROM messages`)
	require.NoError(t, err)

	var h interface{}
	require.Eventually(t, func() bool {
		sample, err := s.SampleHygiene(ctx)
		require.NoError(t, err)
		h = sample
		m := sample.Tables["messages"]
		return m.Bytes > 0 && m.Live+m.Dead > 0 && m.Dead >= 20 && sample.OldestXminHeld > 0
	}, 10*time.Second, 50*time.Millisecond, "%+v", h)
	sample, err := s.SampleHygiene(ctx)
	require.NoError(t, err)
	assert.Contains(t, sample.OldestXminBy, "herald")
	assert.Less(t, sample.OldestXminHeld, time.Minute)
}

// The background loops run their work every interval and report it.
func TestBackgroundLoops(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: "loop",
		Options: json.RawMessage(`{"retentionEnabled":true,"retentionSeconds":60}`)})
	require.NoError(t, err)
	pushN(t, s, "loop", 3)
	age(t, s, "loop", 1, 3, 120)
	retained := make(chan []queue.RetentionDeleted, 1)
	sampled := make(chan *queue.Hygiene, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = s.RunRetentionLoop(ctx, 20*time.Millisecond, func(d []queue.RetentionDeleted) {
			select {
			case retained <- d:
			default:
			}
		})
	})
	wg.Go(func() {
		_ = s.RunHygieneLoop(ctx, 20*time.Millisecond, func(h *queue.Hygiene) {
			select {
			case sampled <- h:
			default:
			}
		})
	})
	select {
	case d := <-retained:
		assert.EqualValues(t, 3, deletedBy(d, "loop", queue.RetentionAge))
	case <-time.After(10 * time.Second):
		t.Fatal("retention loop reported nothing")
	}
	select {
	case h := <-sampled:
		assert.Contains(t, h.Tables, "messages")
	case <-time.After(10 * time.Second):
		t.Fatal("hygiene loop reported nothing")
	}
	cancel()
	wg.Wait()
}

// A table that grew is analyzed even while the rows that grew it are not
// yet in the activity statistics: a backend reports its counts at most
// once a second (PGSTAT_MIN_INTERVAL), so the growth a statement just
// committed is not in pg_stat_user_tables for up to that long, and a
// check reading n_live_tup there saw nothing (registering a group on a
// loaded machine left its grown tables to a later check). The table's size
// on disk is current at once.
func TestAnalyzeGrown_SeesGrowthNotYetInTheActivityStatistics(t *testing.T) {
	s := newStore(t)
	exec(t, s, "ANALYZE")
	conn, err := s.Pool().Acquire(ctxT(t))
	require.NoError(t, err)
	defer conn.Release()
	// A statement reported now; the next within a second stays pending.
	_, err = conn.Exec(ctxT(t), `SELECT push('warm', 'p', '{"n":1}'::jsonb)`)
	require.NoError(t, err)
	_, err = conn.Exec(ctxT(t), `SELECT pg_stat_force_next_flush()`)
	require.NoError(t, err)
	_, err = conn.Exec(ctxT(t), `SELECT push('grown', 'p' || i, '{"n":1}'::jsonb) FROM generate_series(1, 1500) i`)
	require.NoError(t, err)

	grown, err := s.AnalyzeGrown(ctxT(t))
	require.NoError(t, err)
	assert.Contains(t, grown, "partitions", "1,500 new partitions on a table analyzed with one")
}
