package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// Eight producers push to one partition at once while a consumer pops and
// acks: every message is delivered exactly once, offsets strictly increase
// with no gap, and each producer's messages arrive in the order it pushed.
func TestOrder_ConcurrentPushersOnePartition(t *testing.T) {
	s := newStore(t)
	const producers, perProducer = 8, 150
	total := producers * perProducer

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perProducer; {
				n := 1 + (i+p)%4 // batches of 1..4 items
				var items []queue.PushItem
				for j := 0; j < n && i < perProducer; j, i = j+1, i+1 {
					b, _ := json.Marshal(map[string]int{"p": p, "i": i})
					items = append(items, queue.PushItem{Queue: "q", Partition: "only", Payload: b,
						TransactionID: fmt.Sprintf("p%d-%d", p, i)})
				}
				if _, err := s.Push(ctx, items); err != nil {
					errs <- err
					return
				}
			}
		}()
	}

	next := make([]int, producers)
	var lastOffset int64
	got := 0
	for got < total {
		require.NoError(t, ctx.Err(), "timed out after %d of %d messages", got, total)
		select {
		case err := <-errs:
			require.NoError(t, err)
		default:
		}
		res, err := s.Pop(ctx, queue.PopRequest{Queue: "q", Partition: "only", Batch: 37})
		require.NoError(t, err)
		for _, m := range res.Messages {
			require.Equal(t, lastOffset+1, m.Offset, "offsets are dense and strictly increasing")
			lastOffset = m.Offset
			var v struct{ P, I int }
			require.NoError(t, json.Unmarshal(m.Data, &v))
			require.Equal(t, next[v.P], v.I, "producer %d's messages in push order", v.P)
			next[v.P]++
			got++
		}
		if len(res.Messages) > 0 {
			for _, r := range ackAll(t, s, res, queue.StatusCompleted) {
				require.True(t, r.Success)
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, int64(total), lastOffset)
	assert.Empty(t, pop(t, s, queue.PopRequest{Queue: "q", Batch: 10}).Messages, "nothing left, nothing twice")
}

// Concurrent consumers of one group never receive the same message twice,
// and between them they receive everything.
func TestOrder_ConcurrentConsumersNoDoubleDelivery(t *testing.T) {
	s := newStore(t)
	for p := 0; p < 6; p++ {
		push(t, s, "q", fmt.Sprintf("p%d", p), nums(1, 50)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			empty := 0
			for empty < 3 && ctx.Err() == nil {
				res, err := s.Pop(ctx, queue.PopRequest{Queue: "q", Batch: 7, Partitions: 2})
				if !assert.NoError(t, err) {
					return
				}
				if len(res.Messages) == 0 {
					empty++
					continue
				}
				empty = 0
				mu.Lock()
				for _, m := range res.Messages {
					seen[m.ID]++
				}
				mu.Unlock()
				acks := make([]queue.Ack, len(res.Messages))
				for i, m := range res.Messages {
					acks[i] = queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID}
				}
				_, err = s.Ack(ctx, acks)
				assert.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	assert.Len(t, seen, 300)
	for id, n := range seen {
		assert.Equal(t, 1, n, "message %s delivered %d times", id, n)
	}
}

// Many producers retrying the same transactionId at once (coalesced or not):
// exactly one message is stored and every answer names it.
func TestPush_ConcurrentSameTransactionID(t *testing.T) {
	s := newStore(t)
	const n = 16
	ctx := ctxT(t)
	results := make([]queue.PushResult, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.Push(ctx, []queue.PushItem{{Queue: "q", TransactionID: "same", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}})
			if assert.NoError(t, err) {
				results[i] = res[0]
			}
		}()
	}
	wg.Wait()
	queued := 0
	for _, r := range results {
		if r.Status == queue.StatusQueued {
			queued++
		}
		assert.Equal(t, results[0].MessageID, r.MessageID)
		assert.Equal(t, 0, r.Index)
	}
	assert.Equal(t, 1, queued)
	res := pop(t, s, queue.PopRequest{Queue: "q", Batch: 10})
	assert.Len(t, res.Messages, 1)
}
