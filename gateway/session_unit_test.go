package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// The session's own semantics, behind a fake transport: credit and
// settlement, the write queue's bounds, drain, the release policy on close,
// and one close whoever calls it. The store and the poller are real.

// fakeTransport records what a session writes and how it is closed. With a
// gate, each write waits for a token from it (or for the close); with
// pieces, for that many, telling progress of each but the last (a large
// write the client takes piece by piece).
type fakeTransport struct {
	gate     chan struct{}
	wrote    chan outItem
	closed   chan struct{}
	pieces   int
	progress func()

	mu     sync.Mutex
	closes []*Disconnect
}

func newFakeTransport(gated bool) *fakeTransport {
	f := &fakeTransport{wrote: make(chan outItem, 1000), closed: make(chan struct{})}
	if gated {
		f.gate = make(chan struct{})
	}
	return f
}

func (f *fakeTransport) write(it outItem) bool {
	for i := range max(f.pieces, 1) {
		if f.gate == nil {
			break
		}
		if i > 0 {
			f.progress()
		}
		select {
		case <-f.gate:
		case <-f.closed:
			return false
		}
	}
	f.wrote <- it
	return true
}

func (f *fakeTransport) close(d *Disconnect) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closes = append(f.closes, d)
	if len(f.closes) == 1 {
		close(f.closed)
	}
}

func (f *fakeTransport) closeCalls() []*Disconnect {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*Disconnect(nil), f.closes...)
}

// take lets the write under way take one gate token; it fails the test if
// the session closed the transport instead.
func (f *fakeTransport) take(t *testing.T) {
	t.Helper()
	select {
	case f.gate <- struct{}{}:
	case <-f.closed:
		t.Fatalf("closed while the client was reading: %+v", f.closeCalls()[0])
	}
}

// next waits for the next written item.
func (f *fakeTransport) next(t *testing.T) outItem {
	t.Helper()
	select {
	case it := <-f.wrote:
		return it
	case <-time.After(5 * time.Second):
		t.Fatal("nothing written within 5 s")
		return outItem{}
	}
}

// nothing asserts that nothing is written within d.
func (f *fakeTransport) nothing(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case it := <-f.wrote:
		t.Fatalf("unexpected write: %+v", it)
	case <-time.After(d):
	}
}

// testServer is a Server on a store of its own with a running poller.
func testServer(t *testing.T, cfg func(*Config)) *Server {
	t.Helper()
	store := queuetest.NewStore(t)
	p, err := poller.New(poller.Config{Store: store})
	require.NoError(t, err)
	t.Cleanup(p.Start())
	c := Config{Store: store, Poller: p}
	if cfg != nil {
		cfg(&c)
	}
	s, err := New(c)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

// testSession starts a session of s with transport f; it ends with the test.
func testSession(t *testing.T, s *Server, f *fakeTransport, opts sessionOptions) *session {
	t.Helper()
	ss := newSession(s, opts)
	ss.t = f
	ss.start()
	t.Cleanup(func() {
		ss.close(nil)
		ss.wait()
	})
	return ss
}

func subscribeTo(t *testing.T, ss *session, q string, batch, credit int, autoAck bool) *subscription {
	t.Helper()
	sub, err := ss.subscribe(&poller.Intention{Target: queue.Target{Queue: q}, Batch: batch, Credit: credit, AutoAck: autoAck})
	require.NoError(t, err)
	ss.startSub(sub)
	return sub
}

// pushTo pushes one message to each partition.
func pushTo(t *testing.T, s *Server, q string, partitions ...string) {
	t.Helper()
	items := make([]queue.PushItem, len(partitions))
	for i, p := range partitions {
		items[i] = queue.PushItem{Queue: q, Partition: p, Payload: []byte(`1`)}
	}
	res, err := s.store.Push(context.Background(), items)
	require.NoError(t, err)
	s.afterPush(res)
}

// available reports how many messages of a partition a plain pop gets now
// (and leaves them leased to it).
func available(t *testing.T, s *Server, q, partition string) int {
	t.Helper()
	res, err := s.store.Pop(context.Background(), queue.PopRequest{Queue: q, Partition: partition, Batch: 10})
	require.NoError(t, err)
	return len(res.Messages)
}

// A subscription takes what its credit allows; an ack made anywhere on
// this instance (here POST /api/v1/ack) settles the delivery and gives its
// credit back at once.
func TestSession_CreditComesBackWithAcks(t *testing.T) {
	t.Parallel()
	s := testServer(t, nil)
	f := newFakeTransport(false)
	ss := testSession(t, s, f, sessionOptions{})
	sub := subscribeTo(t, ss, "credit", 1, 2, false)
	pushTo(t, s, "credit", "a", "b", "c")

	first, second := f.next(t), f.next(t)
	f.nothing(t, 300*time.Millisecond) // credit 2: nothing more until an ack
	for _, it := range []outItem{first, second} {
		require.Same(t, sub, it.sub)
		require.Len(t, it.res.Messages, 1)
	}
	ss.mu.Lock()
	assert.Len(t, ss.inflight, 2)
	ss.mu.Unlock()

	m := first.res.Messages[0]
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/api/v1/ack", strings.NewReader(fmt.Sprintf(
		`{"transactionId":%q,"partitionId":%q,"leaseId":%q}`, m.TransactionID, m.PartitionID, m.LeaseID))))
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	require.Contains(t, w.Body.String(), `"success":true`)

	third := f.next(t)
	require.Len(t, third.res.Messages, 1)
	ss.mu.Lock()
	assert.Len(t, ss.inflight, 2, "the acked delivery left, the third came")
	_, held := ss.inflight[deliveryKey{m.LeaseID, m.PartitionID, m.TransactionID}]
	ss.mu.Unlock()
	assert.False(t, held)

	// The client's own ack goes through the same path.
	m = second.res.Messages[0]
	out, err := ss.ack(context.Background(), []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID,
		LeaseID: m.LeaseID, Status: queue.StatusCompleted}}, []string{""})
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.True(t, out[0].Success)
	ss.mu.Lock()
	assert.Len(t, ss.inflight, 1)
	ss.mu.Unlock()
}

// An autoAck subscription's credit comes back once a delivery is written:
// the write, not the client, bounds it.
func TestSession_AutoAckCreditOnWrite(t *testing.T) {
	t.Parallel()
	s := testServer(t, nil)
	f := newFakeTransport(true)
	ss := testSession(t, s, f, sessionOptions{})
	subscribeTo(t, ss, "auto", 1, 1, true)
	pushTo(t, s, "auto", "a", "b")
	// The first delivery waits at the gate: credit 1 is spent.
	waitFor(t, func() bool { ss.mu.Lock(); defer ss.mu.Unlock(); return ss.writing })
	select {
	case <-f.wrote:
		t.Fatal("written through a closed gate")
	case <-time.After(200 * time.Millisecond):
	}
	ss.mu.Lock()
	assert.Empty(t, ss.out, "nothing more was leased while the first is unwritten")
	assert.Empty(t, ss.inflight, "autoAck keeps nothing in flight")
	ss.mu.Unlock()
	f.gate <- struct{}{}
	f.next(t)
	f.gate <- struct{}{} // written: credit back, the second comes
	f.next(t)
}

// A client that leaves its queue unread: past holdAt its subscriptions
// lease nothing; at maxQueue it is disconnected with 4001 (reconnect), and
// nothing more is queued.
func TestSession_SlowConsumer(t *testing.T) {
	t.Parallel()
	s := testServer(t, nil)
	f := newFakeTransport(true)
	ss := testSession(t, s, f, sessionOptions{holdAt: 2, resumeAt: 1, maxQueue: 3})
	require.True(t, ss.send("0")) // taken by the writer, waits at the gate
	waitFor(t, func() bool { ss.mu.Lock(); defer ss.mu.Unlock(); return len(ss.out) == 0 && ss.writing })
	assert.True(t, ss.send("1"))
	assert.False(t, ss.held.Load())
	assert.True(t, ss.send("2"))
	assert.True(t, ss.held.Load(), "two queued: hold")
	assert.True(t, ss.send("3"))
	assert.False(t, ss.send("4"), "the queue is full")
	select {
	case <-ss.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the slow consumer was not disconnected")
	}
	calls := f.closeCalls()
	require.Len(t, calls, 1)
	require.NotNil(t, calls[0])
	assert.Equal(t, disconnectSlowConsumer, *calls[0])
	assert.True(t, calls[0].Reconnect)
	assert.False(t, ss.send("5"))
}

// A write the client has not taken in SlowConsumerAfter makes a slow
// consumer, however short its queue: closed 4001 (reconnect). A client
// that keeps taking its writes, each well within the bound, is not one,
// however long its writer runs.
func TestSession_WriteWaitingPastTheBoundIsASlowConsumer(t *testing.T) {
	t.Parallel()
	s := testServer(t, nil)
	t.Run("Stuck", func(t *testing.T) {
		t.Parallel()
		f := newFakeTransport(true)
		ss := testSession(t, s, f, sessionOptions{})
		start := time.Now()
		require.True(t, ss.send("0")) // never taken
		select {
		case <-ss.done:
		case <-time.After(SlowConsumerAfter + 10*time.Second):
			t.Fatal("the slow consumer was not disconnected")
		}
		took := time.Since(start)
		t.Logf("closed after %v", took)
		assert.GreaterOrEqual(t, took, SlowConsumerAfter)
		calls := f.closeCalls()
		require.Len(t, calls, 1)
		require.NotNil(t, calls[0])
		assert.Equal(t, disconnectSlowConsumer, *calls[0])
		assert.False(t, ss.send("1"), "nothing more is queued")
	})
	t.Run("Reading", func(t *testing.T) {
		t.Parallel()
		f := newFakeTransport(true)
		ss := testSession(t, s, f, sessionOptions{})
		const n = 6 // one every quarter of the bound: 1.5 bounds in all
		for i := range n {
			require.True(t, ss.send(i))
		}
		pace := time.NewTicker(SlowConsumerAfter / 4)
		defer pace.Stop()
		for range n {
			<-pace.C // the client's pace, not a wait for a result
			f.take(t)
			f.next(t)
		}
		assert.Empty(t, f.closeCalls(), "a client that keeps reading is not closed")
		assert.True(t, ss.send("more"))
	})
	t.Run("TakingALargeWrite", func(t *testing.T) {
		t.Parallel()
		f := newFakeTransport(true)
		f.pieces = 6 // one every quarter of the bound: 1.5 bounds in all
		ss := testSession(t, s, f, sessionOptions{})
		f.progress = ss.progressed
		require.True(t, ss.send("large"))
		pace := time.NewTicker(SlowConsumerAfter / 4)
		defer pace.Stop()
		for range f.pieces {
			<-pace.C
			f.take(t)
		}
		f.next(t)
		assert.Empty(t, f.closeCalls(), "a client that keeps taking a large write is not closed")
	})
}

// The hold ends when the writer takes an item that leaves at most
// resumeAt queued.
func TestSession_HoldResumes(t *testing.T) {
	t.Parallel()
	s := testServer(t, nil)
	f := newFakeTransport(true)
	ss := testSession(t, s, f, sessionOptions{holdAt: 3, resumeAt: 1})
	require.True(t, ss.send("0")) // taken by the writer, waits at the gate
	waitFor(t, func() bool { ss.mu.Lock(); defer ss.mu.Unlock(); return len(ss.out) == 0 && ss.writing })
	for _, fr := range []string{"1", "2", "3"} {
		require.True(t, ss.send(fr))
	}
	assert.True(t, ss.held.Load())
	f.gate <- struct{}{} // "0" written; "1" taken, two left
	assert.Equal(t, "0", f.next(t).frame)
	waitFor(t, func() bool { ss.mu.Lock(); defer ss.mu.Unlock(); return len(ss.out) == 2 })
	assert.True(t, ss.held.Load(), "above resumeAt")
	f.gate <- struct{}{} // "1" written; "2" taken, one left
	assert.Equal(t, "1", f.next(t).frame)
	waitFor(t, func() bool { return !ss.held.Load() })
	f.gate <- struct{}{}
	f.gate <- struct{}{}
	assert.Equal(t, "2", f.next(t).frame)
	assert.Equal(t, "3", f.next(t).frame)
}

// A stream whose page has already reopened (a newer stream of its chain
// joined before this instance saw the old connection end) keeps nothing
// for a resume: what it wrote past the new stream's token never reached
// the page, and goes back at once; a stream of another chain keeps it.
func TestSession_ClosingAfterANewerStreamOfItsChainKeepsNothing(t *testing.T) {
	t.Parallel()
	s := testServer(t, func(c *Config) { c.SSEResumeGrace = time.Minute })
	key := chainKey(newOrigin(), "")
	closing := func(partition string, chain chainRef) {
		t.Helper()
		f := newFakeTransport(false)
		ss := testSession(t, s, f, sessionOptions{keepForResume: true, chain: chain})
		subscribeTo(t, ss, "chain", 1, 1, false)
		pushTo(t, s, "chain", partition)
		f.next(t)        // written
		s.joinChain(key) // the page reopens
		ss.close(nil)
		ss.wait()
	}
	closing("mine", s.joinChain(key))
	assert.Equal(t, 1, available(t, s, "chain", "mine"), "given back at once")
	closing("other", s.joinChain(chainKey(newOrigin(), "")))
	assert.Zero(t, available(t, s, "chain", "other"), "another chain's stream keeps it for its resume")
}

// With keepForResume, a closing session keeps the leases of what it wrote
// for the resume grace and gives back at once what it had not written;
// without, it gives everything back at once.
func TestSession_CloseReleasePolicy(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{true, false} {
		t.Run(map[bool]string{true: "KeepForResume", false: "AtOnce"}[keep], func(t *testing.T) {
			t.Parallel()
			s := testServer(t, func(c *Config) { c.SSEResumeGrace = time.Minute })
			f := newFakeTransport(true)
			ss := testSession(t, s, f, sessionOptions{keepForResume: keep})
			subscribeTo(t, ss, "policy", 1, 2, false)
			pushTo(t, s, "policy", "a")
			// The writer takes the first delivery (the gate holds it), and
			// the second stays queued.
			waitFor(t, func() bool { ss.mu.Lock(); defer ss.mu.Unlock(); return ss.writing && len(ss.out) == 0 })
			pushTo(t, s, "policy", "b")
			waitFor(t, func() bool { ss.mu.Lock(); defer ss.mu.Unlock(); return len(ss.out) == 1 })
			ss.mu.Lock()
			unwritten := ss.out[0].res.Messages[0].Partition
			ss.mu.Unlock()
			written := map[string]string{"a": "b", "b": "a"}[unwritten]

			ss.close(nil)
			ss.wait()
			assert.Equal(t, 1, available(t, s, "policy", unwritten), "the unwritten delivery is given back at once")
			if keep {
				assert.Zero(t, available(t, s, "policy", written), "the written one waits for a resume")
				s.Close() // gives back what waits for a resume
			}
			assert.Equal(t, 1, available(t, s, "policy", written))
			_, held := s.deliveries.m.Load(deliveryKey{})
			assert.False(t, held)
			n := 0
			s.deliveries.m.Range(func(any, any) bool { n++; return true })
			assert.Zero(t, n, "nothing of the session is left in the registry")
		})
	}
}

// Drain withdraws the subscriptions at once, then (with flushOnDrain)
// writes what is queued, then closes with 4000, reconnect.
func TestSession_DrainFlushesThenCloses(t *testing.T) {
	t.Parallel()
	s := testServer(t, nil)
	f := newFakeTransport(true)
	ss := testSession(t, s, f, sessionOptions{flushOnDrain: true})
	sub := subscribeTo(t, ss, "drain", 1, 10, false)
	for _, fr := range []string{"0", "1", "2"} {
		require.True(t, ss.send(fr))
	}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		ss.drain(0)
	}()
	waitFor(t, func() bool { return s.poller.Intentions() == 0 }) // withdrawn at once
	_, err := ss.subscribe(&poller.Intention{Target: queue.Target{Queue: "drain"}})
	assert.ErrorIs(t, err, errDraining)
	pushTo(t, s, "drain", "a")
	for _, want := range []string{"0", "1", "2"} {
		f.gate <- struct{}{}
		assert.Equal(t, want, f.next(t).frame)
	}
	select {
	case <-drained:
	case <-time.After(5 * time.Second):
		t.Fatal("drain did not end")
	}
	calls := f.closeCalls()
	require.Len(t, calls, 1)
	require.NotNil(t, calls[0])
	assert.Equal(t, disconnectShutdown, *calls[0])
	f.nothing(t, 100*time.Millisecond) // nothing was leased to the withdrawn subscription
	assert.Equal(t, 1, available(t, s, "drain", "a"))
	assert.NotNil(t, sub.cancel)
}

// close runs once, whoever calls it and however often; after it nothing is
// queued or delivered.
func TestSession_CloseOnce(t *testing.T) {
	t.Parallel()
	s := testServer(t, nil)
	f := newFakeTransport(false)
	ss := testSession(t, s, f, sessionOptions{})
	sub := subscribeTo(t, ss, "once", 1, 1, false)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				ss.close(&disconnectTokenExpired)
			} else {
				ss.close(nil)
			}
		}()
	}
	wg.Wait()
	ss.wait()
	require.Len(t, f.closeCalls(), 1)
	assert.False(t, ss.send("late"))
	assert.False(t, ss.deliver(sub, &queue.PopResult{Messages: []queue.Message{{LeaseID: "l", PartitionID: "p", TransactionID: "t"}}}))
	assert.False(t, ss.unsubscribe(sub.id))
	_, err := ss.subscribe(&poller.Intention{Target: queue.Target{Queue: "once"}})
	assert.ErrorIs(t, err, errDraining)
}

// A token's expiry ends the session with 4501, no reconnect.
func TestSession_TokenExpiry(t *testing.T) {
	t.Parallel()
	s := testServer(t, nil)
	f := newFakeTransport(false)
	ss := testSession(t, s, f, sessionOptions{expires: time.Now().Add(100 * time.Millisecond)})
	select {
	case <-ss.done:
	case <-time.After(5 * time.Second):
		t.Fatal("not closed at expiry")
	}
	calls := f.closeCalls()
	require.Len(t, calls, 1)
	require.NotNil(t, calls[0])
	assert.Equal(t, Disconnect{Code: CloseUnauthorized, Reason: "token expired"}, *calls[0])
}

// Ack items are matched to one delivery: by leaseId, or by the message and
// the sub or group they name.
func TestSession_ResolveAck(t *testing.T) {
	t.Parallel()
	ss := &session{}
	s1 := &subscription{ss: ss, id: "s1", group: "a"}
	s2 := &subscription{ss: ss, id: "s2", group: "b"}
	k1 := deliveryKey{"l1", "p", "t"}
	k2 := deliveryKey{"l2", "p", "t"}
	ss.inflight = map[deliveryKey]delivery{k1: {sub: s1}, k2: {sub: s2}}
	for _, tc := range []struct {
		name  string
		ack   queue.Ack
		sub   string
		want  *subscription
		error string
	}{
		{"ByLease", queue.Ack{TransactionID: "t", PartitionID: "p", LeaseID: "l2"}, "", s2, ""},
		{"ByLeaseAndSub", queue.Ack{TransactionID: "t", PartitionID: "p", LeaseID: "l1"}, "s1", s1, ""},
		{"LeaseOfAnotherSub", queue.Ack{TransactionID: "t", PartitionID: "p", LeaseID: "l1"}, "s2", nil, ErrTextNotHeld},
		{"LeaseOfAnotherGroup", queue.Ack{TransactionID: "t", PartitionID: "p", LeaseID: "l1", Group: "b"}, "", nil, ErrTextNotHeld},
		{"ForeignLease", queue.Ack{TransactionID: "t", PartitionID: "p", LeaseID: "l9"}, "", nil, ErrTextNotHeld},
		{"Ambiguous", queue.Ack{TransactionID: "t", PartitionID: "p"}, "", nil, ErrTextAmbiguous},
		{"BySub", queue.Ack{TransactionID: "t", PartitionID: "p"}, "s2", s2, ""},
		{"ByGroup", queue.Ack{TransactionID: "t", PartitionID: "p", Group: "a"}, "", s1, ""},
		{"UnknownMessage", queue.Ack{TransactionID: "x", PartitionID: "p"}, "", nil, ErrTextNotHeld},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, sub, why := ss.resolveLocked(tc.ack, tc.sub)
			assert.Equal(t, tc.error, why)
			assert.Same(t, tc.want, sub)
			if tc.want != nil {
				assert.Equal(t, tc.want, ss.inflight[k].sub)
			}
		})
	}
}

// waitFor waits up to 10 s for cond.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, 5*time.Millisecond, "condition not met within 10 s")
}
