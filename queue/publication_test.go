package queue_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// The publication is made once per schema, of message inserts only, and
// instances asking at the same time all get its name.
func TestStore_MessagePublication(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	var schema string
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT current_schema()`).Scan(&schema))

	names := make([]string, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range names {
		wg.Go(func() { names[i], errs[i] = s.MessagePublication(ctx) })
	}
	wg.Wait()
	for i := range names {
		require.NoError(t, errs[i])
		assert.Equal(t, "herald_"+schema, names[i])
	}
	var tables []string
	var insert, update, del bool
	require.NoError(t, s.Pool().QueryRow(ctx, `
		SELECT array_agg(t.schemaname || '.' || t.tablename), bool_and(p.pubinsert), bool_or(p.pubupdate), bool_or(p.pubdelete)
		FROM pg_publication p JOIN pg_publication_tables t ON t.pubname = p.pubname WHERE p.pubname = $1`,
		names[0]).Scan(&tables, &insert, &update, &del))
	assert.Equal(t, []string{schema + ".messages"}, tables)
	assert.True(t, insert)
	assert.False(t, update || del, "only inserts wake anyone")

	again, err := s.MessagePublication(ctx)
	require.NoError(t, err)
	assert.Equal(t, names[0], again)
}

func TestStore_PartitionOf(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	res := push(t, s, "pq", "p-1", 1)
	for range 2 { // the second answer comes from the cache
		q, p, err := s.PartitionOf(ctx, res[0].PartitionID)
		require.NoError(t, err)
		assert.Equal(t, [2]string{"pq", "p-1"}, [2]string{q, p})
	}
	_, _, err := s.PartitionOf(ctx, queue.NewID())
	assert.ErrorIs(t, err, queue.ErrNotFound)
	_, _, err = s.PartitionOf(ctx, "not-a-uuid")
	assert.ErrorIs(t, err, queue.ErrNotFound)
}
