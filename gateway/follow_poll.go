package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

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

func (s *Server) handleFollowPoll(w http.ResponseWriter, r *http.Request) {
	t, err := s.followCheck(r)
	if err != nil {
		s.fail(w, err)
		return
	}
	q := r.URL.Query()
	wait, err := boolParam(q.Get("wait"), "wait")
	if err != nil {
		s.fail(w, err)
		return
	}
	batch, err := clampedParam(q.Get("batch"), "batch", 1, queue.FollowLimitMax)
	if err != nil {
		s.fail(w, err)
		return
	}
	if batch == 0 {
		batch = FollowBatchDefault
	}
	timeout := PopTimeoutDefault
	if v := q.Get("timeout"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			s.fail(w, badRequestf("timeout must be a non-negative number of milliseconds"))
			return
		}
		timeout = min(time.Duration(ms)*time.Millisecond, PopTimeoutMax)
	}
	pos, err := s.followPosition(r.Context(), t, q.Get("after"), q.Get("from"))
	if err != nil {
		s.fail(w, err)
		return
	}
	b, err := s.store.ReadFollow(r.Context(), t, pos, batch)
	if err != nil {
		s.fail(w, err)
		return
	}
	s.follows.m.reads.Inc()
	if len(b.Messages) > 0 || b.Gone != nil || !wait || timeout == 0 {
		s.answerFollowPoll(w, t.Queue, pos, renderFollow(t.Queue, b.Messages), b.Gone, b.Full)
		return
	}
	// Nothing yet: wait on the hub. The read covered everything below its
	// barrier, so the hub's ring (or its next read) has what comes next.
	sink := &pollSink{got: make(chan struct{})}
	f := &follower{partition: t.Partition, sink: sink}
	cover := b.Covered(pos)
	for {
		h := s.follows.hub(t.Queue)
		f.hub = h
		if err := h.join(f, cover); err == nil {
			break
		}
		s.follows.release(h)
		// Behind the hub's ring: read again (whatever came meanwhile).
		if b, err = s.store.ReadFollow(r.Context(), t, pos, batch); err != nil {
			s.fail(w, err)
			return
		}
		if len(b.Messages) > 0 || b.Gone != nil {
			s.answerFollowPoll(w, t.Queue, pos, renderFollow(t.Queue, b.Messages), b.Gone, b.Full)
			return
		}
		cover = b.Covered(pos)
	}
	timer := time.NewTimer(timeout)
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
		return
	}
	if len(items) > batch {
		items = items[:batch] // the rest: the client asks after its last id
	}
	s.answerFollowPoll(w, t.Queue, pos, items, gone, false)
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
	writeJSON(w, http.StatusOK, out)
}
