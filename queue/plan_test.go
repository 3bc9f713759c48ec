package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// An ack finds its message through the unique (partition, transaction id)
// index under the generic plan the pool forces, never by scanning the
// partition: an ack must cost the same on a partition of ten messages and
// of ten million.
func TestPlan_AckResolveUsesTheUniqueIndex(t *testing.T) {
	ctx := context.Background()
	s := queuetest.NewStore(t)
	items := make([]queue.PushItem, 500)
	for i := range items {
		items[i] = queue.PushItem{Queue: "plan", Payload: json.RawMessage(fmt.Sprint(i))}
	}
	res, err := s.Push(ctx, items)
	require.NoError(t, err)
	rows, err := s.Pool().Query(ctx, "EXPLAIN "+queue.AckResolveSQL,
		[]string{res[0].PartitionID, res[1].PartitionID}, []string{res[0].TransactionID, res[1].TransactionID})
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	text := strings.Join(plan, "\n")
	assert.Contains(t, text, "messages_partition_id_transaction_id_key", text)
	assert.NotContains(t, text, "Join Filter: (m.transaction_id", text)
}
