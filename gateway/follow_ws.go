package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/queue"
)

// WebSocket follows: a follow frame starts one (many per connection, beside
// subscriptions), unfollow ends it. Their messages come in follow_deliver
// frames through the session's write queue, so a client that stops reading
// is closed 4001 when that queue is full, as for its subscriptions.

// WSMaxFollows bounds the follows of one connection.
const WSMaxFollows = 100

// wsFollows are a connection's follows.
type wsFollows struct {
	mu   sync.Mutex
	next int
	m    map[string]*wsFollow
	done bool // the connection ended: no new follow
}

// wsFollow is one follow of a connection (a followSink).
type wsFollow struct {
	c      *wsConn
	id     string
	queue  string
	part   string             // the partition followed; empty: the whole queue
	cancel context.CancelFunc // ends its catch-up

	mu   sync.Mutex
	f    *follower // nil until joined
	gone bool      // unfollowed
	gap  queue.FollowPos
}

// followDeliverFrame carries a follow's messages (each with its eventId).
type followDeliverFrame struct {
	Follow   string            `json:"follow"`
	Messages []json.RawMessage `json:"messages"`
	Type     string            `json:"type"`
}

// followGapFrame tells a follow that retention deleted messages after its
// position (gapJSON).
type followGapFrame struct {
	gapJSON
	Follow string `json:"follow"`
	Type   string `json:"type"`
}

// frames renders a delivery; a gap is told once per mark.
func (wf *wsFollow) frames(items []followItem, gone *queue.FollowPos) []any {
	var out []any
	wf.mu.Lock()
	if gone != nil && gone.Compare(wf.gap) > 0 {
		wf.gap = *gone
		out = append(out, followGapFrame{gapJSON: gapOf(wf.queue, *gone, items), Follow: wf.id, Type: "follow_gap"})
	}
	wf.mu.Unlock()
	if len(items) > 0 {
		msgs := make([]json.RawMessage, len(items))
		for i, it := range items {
			msgs[i] = it.data
		}
		out = append(out, followDeliverFrame{Follow: wf.id, Messages: msgs, Type: "follow_deliver"})
	}
	return out
}

// deliver queues the frames (a followSink: it does not block); false when
// the session's write queue is full, which closes it 4001.
func (wf *wsFollow) deliver(items []followItem, gone *queue.FollowPos, _ *followBatch) bool {
	for _, fr := range wf.frames(items, gone) {
		if !wf.c.ss.send(fr) {
			return false
		}
	}
	return true
}

// slow: the session closed itself (its queue overflowed) or is closing.
func (wf *wsFollow) slow() { wf.c.ss.close(&disconnectSlowConsumer) }

// FollowStartTimeoutDefault is Config.FollowStartTimeout's default.
const FollowStartTimeoutDefault = 10 * time.Second

func (c *wsConn) follow(f *wsFrame) {
	t, err := followTarget(f.Queue, f.Partition)
	if err != nil {
		c.ss.send(wsError(f.ID, "bad_request", err.Error()))
		return
	}
	if err := checkConsume(c.claims.Rights, &queue.PopRequest{Queue: t.Queue, Partition: t.Partition}); err != nil {
		c.ss.s.metrics.authFailures.WithLabelValues("forbidden").Inc()
		c.ss.send(wsError(f.ID, "forbidden", err.Error()))
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	// On the reader: bounded, or a from=<time> walking a long queue would
	// stop the connection's other frames (acks) for as long.
	pctx, pcancel := context.WithTimeout(ctx, c.ss.s.cfg.FollowStartTimeout)
	pos, err := c.ss.s.followPosition(pctx, t, "", f.From)
	timedOut := errors.Is(pctx.Err(), context.DeadlineExceeded)
	pcancel()
	if err != nil {
		cancel()
		if timedOut {
			c.ss.send(wsError(f.ID, "timeout", "finding the follow's start took longer than "+
				c.ss.s.cfg.FollowStartTimeout.String()+"; follow from a later time or an id"))
			return
		}
		c.ss.send(wsStoreError(f.ID, err, "starting the follow failed"))
		return
	}
	if c.fl == nil {
		c.fl = &wsFollows{m: map[string]*wsFollow{}}
	}
	c.fl.mu.Lock()
	if c.fl.done || len(c.fl.m) >= WSMaxFollows {
		done := c.fl.done
		c.fl.mu.Unlock()
		cancel()
		if done {
			return
		}
		c.ss.send(wsError(f.ID, "too_many_follows", "at most "+strconv.Itoa(WSMaxFollows)+" follows per connection"))
		return
	}
	c.fl.next++
	wf := &wsFollow{c: c, id: "f" + strconv.Itoa(c.fl.next), queue: t.Queue, part: t.Partition, cancel: cancel}
	c.fl.m[wf.id] = wf
	c.fl.mu.Unlock()
	// lastEventId names the start (after "now", a time, ...): a client cut
	// off before its first message resumes from it without a loss.
	c.ss.send(map[string]any{"type": "followed", "id": f.ID, "follow": wf.id,
		"lastEventId": queue.EncodeFollowID(t.Queue, pos)})
	reqID := f.ID
	// Catch up on a goroutine of its own: the reader goes on meanwhile.
	c.ss.s.stacks.goDo(func() {
		fl, err := c.ss.s.follows.follow(ctx, t, pos, wf, func(items []followItem, gone *queue.FollowPos) error {
			for _, fr := range wf.frames(items, gone) {
				if !c.ss.send(fr) {
					return errClientGone
				}
			}
			c.ss.waitWritten() // a bounded catch-up: one batch queued at a time
			return ctx.Err()
		})
		if err != nil {
			if ctx.Err() == nil && err != errClientGone {
				c.ss.send(wsStoreError(reqID, err, "following failed"))
				c.dropFollow(wf.id)
			}
			return
		}
		wf.mu.Lock()
		gone := wf.gone
		if !gone {
			wf.f = fl
		}
		wf.mu.Unlock()
		if gone {
			fl.hub.leave(fl)
		}
	})
}

// dropFollow forgets a follow and leaves its hub; false when there is
// none of that id.
func (c *wsConn) dropFollow(id string) bool {
	if c.fl == nil {
		return false
	}
	c.fl.mu.Lock()
	wf := c.fl.m[id]
	delete(c.fl.m, id)
	c.fl.mu.Unlock()
	if wf == nil {
		return false
	}
	wf.cancel()
	wf.mu.Lock()
	wf.gone = true
	fl := wf.f
	wf.f = nil
	wf.mu.Unlock()
	if fl != nil {
		fl.hub.leave(fl)
	}
	return true
}

func (c *wsConn) unfollow(f *wsFrame) {
	if !c.dropFollow(f.Follow) {
		c.ss.send(wsError(f.ID, "unknown_follow", "no follow "+strconv.Quote(f.Follow)))
		return
	}
	c.ss.send(map[string]any{"type": "unfollowed", "id": f.ID, "follow": f.Follow})
}

// recheckFollows ends, each with its own forbidden error, the follows that
// rights (a fresh token's) no longer allow.
func (c *wsConn) recheckFollows(rights *auth.Rights) {
	if c.fl == nil {
		return
	}
	c.fl.mu.Lock()
	var denied []string
	errs := map[string]error{}
	for id, wf := range c.fl.m {
		if err := checkConsume(rights, &queue.PopRequest{Queue: wf.queue, Partition: wf.part}); err != nil {
			denied = append(denied, id)
			errs[id] = err
		}
	}
	c.fl.mu.Unlock()
	for _, id := range denied {
		if c.dropFollow(id) {
			c.ss.send(map[string]any{"type": "error", "code": "forbidden", "follow": id, "message": errs[id].Error()})
		}
	}
}

// endFollows ends every follow of a connection that ended.
func (c *wsConn) endFollows() {
	if c.fl == nil {
		return
	}
	c.fl.mu.Lock()
	c.fl.done = true
	ids := make([]string, 0, len(c.fl.m))
	for id := range c.fl.m {
		ids = append(ids, id)
	}
	c.fl.mu.Unlock()
	for _, id := range ids {
		c.dropFollow(id)
	}
}
