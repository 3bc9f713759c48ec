package gateway_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A WebSocket connection's ack frames were applied one at a
// time, each a transaction of its own with its commit's fsync, while the
// reader waited: one consumer acking message by message could not go past
// one ack per commit, whatever the database could do. Ack frames sent back
// to back now share transactions, and a frame after them (here a ping)
// is answered only once they are applied.
func TestWS_AcksBackToBackShareTransactions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 30
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf(`{"queue":"pipe","partition":"p%d","payload":{"n":%d}}`, i, i)
	}
	e.pushItems("[" + strings.Join(items, ",") + "]")
	c := e.dialWS(t)
	c.subscribe(fmt.Sprintf(`{"type":"subscribe","id":1,"queue":"pipe","batch":1,"maxInFlight":%d}`, n))
	var ms []message
	for len(ms) < n {
		ms = append(ms, deliveredMessages(t, c.next("deliver"))...)
	}
	require.Len(t, ms, n)

	before := e.store.QueryStats().Snapshot()["ack_lock"]
	for i, m := range ms {
		c.send(strings.Replace(ackFrame([]message{m}, "completed"), `"id":"a"`, fmt.Sprintf(`"id":"a%d"`, i), 1))
	}
	c.send(`{"type":"ping","id":"after"}`)
	c.next("pong")
	require.Len(t, c.pending, n, "every ack was answered before the ping that followed them")
	for _, f := range c.pending {
		require.Equal(t, `"ack_result"`, string(f["type"]))
		var results []ackResult
		require.NoError(t, json.Unmarshal(f["results"], &results))
		require.Len(t, results, 1)
		assert.True(t, results[0].Success, "%s", f["results"])
	}
	txs := e.store.QueryStats().Snapshot()["ack_lock"] - before
	t.Logf("%d ack frames in %d transactions", n, txs)
	assert.Less(t, txs, uint64(n/2), "back-to-back acks share transactions")
	e.popEmpty("/api/v1/pop/queue/pipe?wait=false&partitions=100&batch=100")
}
