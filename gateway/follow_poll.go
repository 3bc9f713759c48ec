package gateway

import (
	"encoding/json"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

// Follow long-poll: GET /api/v1/follow/queue/{q}[/partition/{p}]?after=ID
// (or from=) &wait=true&timeout=ms&batch=n answers the messages after the
// position at once, or when one arrives, or 204 when timeout passes.
// Waiting, it is a follower of the hub like a stream (no goroutine but the
// request's, no query), which hands it its first batch.

// FollowBatchDefault is a follow long-poll's batch when it names none.
const FollowBatchDefault = 100

// followPollJSON is a follow long-poll's answer: the messages (each with
// its eventId), the id to ask after next time (the last message's, or a
// gap's mark), and the gap, when retention deleted messages after the
// position asked.
type followPollJSON struct {
	Messages    []json.RawMessage `json:"messages"`
	LastEventID string            `json:"lastEventId"`
	Gap         *gapJSON          `json:"gap"`
}

// pollSink takes the first batch the hub hands a waiting long-poll.
type pollSink struct {
	mu    sync.Mutex
	items []followItem
	gone  *queue.FollowPos
	got   chan struct{}
}

func (p *pollSink) deliver(items []followItem, gone *queue.FollowPos, _ *followBatch) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.items != nil || p.gone != nil {
		return true // answered already: the client asks again after its last id
	}
	p.items, p.gone = items, gone
	close(p.got)
	return true
}

func (p *pollSink) slow() {}

// followPollParams are a follow long-poll's wait=, batch= and timeout=.
type followPollParams struct {
	wait    bool
	batch   int
	timeout time.Duration
}

// readFollowPoll reads and bounds a follow long-poll's parameters.
func readFollowPoll(q url.Values) (followPollParams, error) {
	var p followPollParams
	var err error
	if p.wait, err = httpapi.BoolParam(q.Get("wait"), "wait"); err != nil {
		return p, err
	}
	if p.batch, err = httpapi.ClampedParam(q.Get("batch"), "batch", 1, queue.FollowLimitMax); err != nil {
		return p, err
	}
	if p.batch == 0 {
		p.batch = FollowBatchDefault
	}
	p.timeout = PopTimeoutDefault
	if v := q.Get("timeout"); v != "" {
		// Bounded as a pop's is, before it becomes a duration (a count
		// of milliseconds past the maximum overflowed it).
		ms, err := httpapi.ClampedParam(v, "timeout", 0, int(PopTimeoutMax/time.Millisecond))
		if err != nil {
			return p, err
		}
		p.timeout = time.Duration(ms) * time.Millisecond
	}
	return p, nil
}

func (s *Server) handleFollowPoll(w http.ResponseWriter, r *http.Request) error {
	t, err := s.followCheck(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	p, err := readFollowPoll(q)
	if err != nil {
		return err
	}
	pos, err := s.followPosition(r.Context(), t, q.Get("after"), q.Get("from"))
	if err != nil {
		return err
	}
	b, err := s.store.ReadFollow(r.Context(), t, pos, p.batch)
	if err != nil {
		return err
	}
	s.follows.m.reads.Inc()
	if len(b.Messages) > 0 || b.Gone != nil || !p.wait || p.timeout == 0 {
		s.answerFollowPoll(w, t.Queue, pos, renderFollow(t.Queue, b.Messages), b.Gone, b.Full)
		return nil
	}
	// Nothing yet: wait on the hub. The read covered everything below its
	// barrier, so the hub's ring (or its next read) has what comes next.
	sink := &pollSink{got: make(chan struct{})}
	f := &follower{partition: t.Partition, sink: sink}
	b, joined, err := s.joinFollowPoll(r, t, pos, p.batch, f, b)
	if err != nil {
		return err
	}
	if !joined {
		s.answerFollowPoll(w, t.Queue, pos, renderFollow(t.Queue, b.Messages), b.Gone, b.Full)
		return nil
	}
	timer := time.NewTimer(p.timeout)
	defer timer.Stop()
	select {
	case <-sink.got:
	case <-timer.C:
	case <-r.Context().Done():
	case <-s.draining:
	}
	f.hub.leave(f)
	sink.mu.Lock()
	items, gone := sink.items, sink.gone
	sink.mu.Unlock()
	if len(items) == 0 && gone == nil {
		// The position to ask after next, for a poll that started from=.
		w.Header().Set("Herald-Last-Event-Id", queue.EncodeFollowID(t.Queue, pos))
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if len(items) > p.batch {
		items = items[:p.batch] // the rest: the client asks after its last id
	}
	s.answerFollowPoll(w, t.Queue, pos, items, gone, false)
	return nil
}

// joinFollowPoll makes f, a waiting long-poll, a follower of its queue's
// hub from what the read b covered (joined). When the hub's ring has moved
// past that, it reads again: a batch with messages or a gap is the answer,
// and f joins nothing.
func (s *Server) joinFollowPoll(r *http.Request, t queue.FollowTarget, pos queue.FollowPos, batch int,
	f *follower, b queue.FollowBatch) (queue.FollowBatch, bool, error) {
	cover := b.Covered(pos)
	for {
		h := s.follows.hub(t.Queue)
		f.hub = h
		if err := h.join(f, cover); err == nil {
			return b, true, nil
		}
		s.follows.release(h)
		// Behind the hub's ring: read again (whatever came meanwhile).
		var err error
		if b, err = s.store.ReadFollow(r.Context(), t, pos, batch); err != nil {
			return b, false, err
		}
		if len(b.Messages) > 0 || b.Gone != nil {
			return b, false, nil
		}
		cover = b.Covered(pos)
	}
}

// answerFollowPoll writes 200 with items after pos (and a gap).
func (s *Server) answerFollowPoll(w http.ResponseWriter, q string, pos queue.FollowPos, items []followItem,
	gone *queue.FollowPos, _ bool) {
	out := followPollJSON{Messages: make([]json.RawMessage, len(items))}
	last := pos
	for i, it := range items {
		out.Messages[i] = it.data
		last = it.pos
	}
	if gone != nil && gone.Compare(pos) > 0 {
		g := gapOf(q, *gone, items)
		out.Gap = &g
		if len(items) == 0 || items[0].pos.Compare(*gone) > 0 {
			if gone.Compare(last) > 0 {
				last = *gone
			}
		}
	}
	out.LastEventID = queue.EncodeFollowID(q, last)
	httpapi.WriteJSON(w, http.StatusOK, out)
}
