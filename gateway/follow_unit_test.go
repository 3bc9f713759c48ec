package gateway

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// A hub read's batch writes each full chunk of streams at once, while the
// hub is still handing the read to the others: the first followers get a
// message before the last are handed it, whatever their number. The
// frames written are the hub's, exactly.
func TestFollowBatch_FullChunkIsWrittenBeforeTheHandOutEnds(t *testing.T) {
	srv := &Server{cfg: Config{FollowBuffer: 4}}
	items := renderFollow("q", []queue.FollowMessage{
		{Pos: queue.FollowPos{XID: 7, PartitionID: "p", Offset: 1}, Message: queue.Message{Queue: "q", Offset: 1}},
		{Pos: queue.FollowPos{XID: 7, PartitionID: "p", Offset: 2}, Message: queue.Message{Queue: "q", Offset: 2}},
	})
	want := append(append([]byte(nil), items[0].sse...), items[1].sse...)
	written := make(chan int, followFlushChunk+1)
	b := newFollowBatch(nil)
	streams := make([]*followStream, followFlushChunk+1)
	for i := range streams {
		st := &followStream{s: srv, queue: "q", done: make(chan struct{})}
		st.tryRaw = func(frames [][]byte) ([][]byte, error) {
			assert.Equal(t, want, bytes.Join(frames, nil), "stream %d gets the hub's frames, in order", i)
			written <- i
			return nil, nil
		}
		streams[i] = st
		require.True(t, st.deliver(items, nil, b))
	}
	// The hand-out is not over (run not called): the first chunk is being
	// written all the same; the last stream, alone in its chunk, waits.
	for range followFlushChunk {
		select {
		case i := <-written:
			assert.Less(t, i, followFlushChunk, "only the full chunk is written before run")
		case <-time.After(10 * time.Second):
			t.Fatalf("the first chunk was not written before the hand-out ended: %d of %d", len(written), followFlushChunk)
		}
	}
	select {
	case i := <-written:
		t.Fatalf("stream %d of the chunk that is not full was written before run", i)
	default:
	}
	b.run()
	assert.Equal(t, followFlushChunk, <-written, "run writes the rest")
	for _, st := range streams {
		st.wg.Wait() // each stream's writer is done
		st.mu.Lock()
		assert.False(t, st.writing)
		assert.Zero(t, st.waiting, "nothing left waiting")
		st.mu.Unlock()
	}
}
