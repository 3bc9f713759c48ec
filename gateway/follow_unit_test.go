package gateway

import (
	"bytes"
	"context"
	"net/url"
	"strconv"
	"sync"
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

// A hub that reads again at once (its read came back full) does so while
// the streams of its last read are still being written: a stuck write, or
// 10,000 of them under load, does not hold the next messages back. The
// follower whose write is stuck has them queued behind it, in order.
func TestFollowHub_ReadsOnWhileItsLastBatchIsStillBeingWritten(t *testing.T) {
	s := testServer(t, func(c *Config) { c.FollowBuffer = 2 * followHubBatch })
	ctx := context.Background()
	tgt := queue.FollowTarget{Queue: "fo"}
	pos, err := s.followPosition(ctx, tgt, "", "")
	require.NoError(t, err)

	release := make(chan struct{})
	unstick := sync.OnceFunc(func() { close(release) })
	var mu sync.Mutex
	var got []byte // every byte written, in order
	st := &followStream{s: s, queue: "fo", done: make(chan struct{})}
	st.tryRaw = func(frames [][]byte) ([][]byte, error) {
		mu.Lock()
		first := got == nil
		got = append(append([]byte{}, got...), bytes.Join(frames, nil)...)
		mu.Unlock()
		if first {
			<-release // the first write of the batch is stuck
		}
		return nil, nil
	}
	st.rawv = func(frames [][]byte) bool {
		mu.Lock()
		got = append(got, bytes.Join(frames, nil)...)
		mu.Unlock()
		return true
	}
	f, err := s.follows.follow(ctx, tgt, pos, st, func([]followItem, *queue.FollowPos) error { return nil })
	require.NoError(t, err)
	st.mu.Lock()
	st.f = f
	st.mu.Unlock()
	t.Cleanup(func() { unstick(); st.close(nil); st.wg.Wait() })

	const n = followHubBatch + 100 // two hub reads, the first full
	items := make([]queue.PushItem, n)
	for i := range items {
		items[i] = queue.PushItem{Queue: "fo", Payload: []byte(strconv.Itoa(i))}
	}
	_, err = s.store.Push(ctx, items)
	require.NoError(t, err)
	s.WakeFollowers("fo")
	// The first write is stuck; the hub's second read hands the last 100
	// to the stream all the same.
	require.Eventually(t, func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.waiting == n
	}, 10*time.Second, 5*time.Millisecond, "the second read's messages reached the stream while its first write was stuck")
	unstick()
	require.Eventually(t, func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.waiting == 0 && !st.writing
	}, 10*time.Second, 5*time.Millisecond, "everything written once the write is unstuck")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, n, bytes.Count(got, []byte("event: message\n")), "every message once")
	at := 0
	for i := range n {
		k := bytes.Index(got[at:], []byte(`"data":`+strconv.Itoa(i)+`,`))
		require.GreaterOrEqual(t, k, 0, "message %d, after message %d", i, i-1)
		at += k
	}
}

// A follow long-poll's timeout is bounded like a pop's: past the maximum it
// is the maximum, however many milliseconds it names (a count whose
// product with a millisecond overflows included), and never negative.
func TestReadFollowPoll_TimeoutPastTheMaximumIsTheMaximum(t *testing.T) {
	for _, v := range []string{"9223372036855", "9300000000000000", "99999999999999999999", strconv.FormatInt(int64(PopTimeoutMax/time.Millisecond)+1, 10)} {
		p, err := readFollowPoll(url.Values{"timeout": {v}})
		require.NoError(t, err, v)
		assert.Equal(t, PopTimeoutMax, p.timeout, v)
	}
	p, err := readFollowPoll(url.Values{"timeout": {"250"}})
	require.NoError(t, err)
	assert.Equal(t, 250*time.Millisecond, p.timeout)
	_, err = readFollowPoll(url.Values{"timeout": {"-1"}})
	assert.Error(t, err)
}
