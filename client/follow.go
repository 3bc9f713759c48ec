package client

import (
	"context"
	"errors"
)

// FollowOptions say what to follow and from where.
type FollowOptions struct {
	Queue     string
	Partition string // empty: every partition of the queue, in one total order
	// From is the start: "now" (the default: what is pushed from now on),
	// "beginning" (everything still stored), an RFC 3339 time (the first
	// message stored at or after it), or an event id (Message.EventID: the
	// messages after it).
	From string
	// OnGap, when set, is told that retention deleted messages the follow
	// had not received (it was away, or read too slowly), before the
	// messages after them. It runs on the goroutine that called Follow.
	// Without it, a gap is not reported.
	OnGap func(Gap)
}

// Gap says that retention deleted messages after the follow's position.
type Gap struct {
	GoneThrough string // the event id of the last message deleted
	NextEventID string // the first message still stored after the position; empty if none yet
}

// followEvent is a delivered message or a gap, in the server's order.
type followEvent struct {
	m   *Message
	gap *Gap
}

// followBuffer is how many messages a follow holds for its handler; when
// it is full the connection's reader waits, and the server closes a
// connection that does not read with 4001 (the client reconnects and the
// follow resumes from its last id).
const followBuffer = 1024

// Follow is one Client.Follow call's state.
type Follow struct {
	c      *Client
	opts   FollowOptions
	events chan followEvent

	standing
	last string // the event id to resume after: the last one received (or the start); under mu
}

// Follow receives every message pushed to a queue (or to one of its
// partitions) after opts.From, in order, with no consumer group, no lease
// and no ack: every follower sees every message, and the position is the
// client's (Message.EventID). Across reconnects, to this server or to
// another behind the same address, it follows again after the last event
// id it received: nothing lost, nothing twice, while retention keeps the
// messages (past it, opts.OnGap is told).
//
// It returns nil when ctx ends, ErrClosed when the client is closed, the
// handler's error when it returns one (to resume later, follow again From
// the EventID of the last message it handled), or the server's refusal
// (a *ServerError, e.g. code forbidden without consume rights, or a
// terminal *CloseError).
func (c *Client) Follow(ctx context.Context, opts FollowOptions, handler Handler) error {
	if opts.Queue == "" {
		return errors.New("herald: FollowOptions.Queue is required")
	}
	f := &Follow{c: c, opts: opts, events: make(chan followEvent, followBuffer), last: opts.From}
	f.init()
	cn, err := c.join(func() { c.follows[f] = true })
	if err != nil {
		return err
	}
	defer f.leave()
	if cn != nil {
		go f.attach(ctx, cn)
	}
	for {
		var ev followEvent
		select {
		case <-ctx.Done():
			return nil
		case <-f.ended:
			return f.err
		case ev = <-f.events:
		}
		if ev.gap != nil {
			if opts.OnGap != nil {
				opts.OnGap(*ev.gap)
			}
			continue
		}
		if err := handler(ctx, ev.m); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// attach follows on cn from the last id received (or opts.From); ctx
// bounds the wait for the answer.
func (f *Follow) attach(ctx context.Context, cn *conn) {
	f.mu.Lock()
	if f.cn == cn {
		f.mu.Unlock()
		return // already following on it
	}
	f.cn = cn
	from := f.last
	f.mu.Unlock()
	body := map[string]any{"type": "follow", "queue": f.opts.Queue}
	if f.opts.Partition != "" {
		body["partition"] = f.opts.Partition
	}
	if from != "" {
		body["from"] = from
	}
	_, err := cn.requestFollow(ctx, body, f)
	var se *ServerError
	if errors.As(err, &se) && se.Code != "shutting_down" && se.Code != "unavailable" {
		f.end(err) // the server will never accept it as it is
	}
}

// started records, before any message, the start the server names; in
// the reader, before any delivery.
func (f *Follow) started(cn *conn, start string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cn != cn {
		return
	}
	if start != "" && (f.last == "" || f.last == f.opts.From) {
		// Until a message comes, a reconnect resumes after the start the
		// server chose (after "now" or a time), not at a new "now".
		f.last = start
	}
}

// deliver hands messages to the handler's goroutine in order, moving the
// resume position past each; it runs on the reader.
func (f *Follow) deliver(ms []*Message) {
	for _, m := range ms {
		select {
		case f.events <- followEvent{m: m}:
		case <-f.left:
			return
		}
		f.mu.Lock()
		f.last = m.EventID
		f.mu.Unlock()
	}
}

// gap hands a gap to the handler's goroutine; with no stored message
// after it, the position moves past the deleted ones, so that a reconnect
// is not told again.
func (f *Follow) gap(g Gap) {
	select {
	case f.events <- followEvent{gap: &g}:
	case <-f.left:
		return
	}
	if g.NextEventID == "" && g.GoneThrough != "" {
		f.mu.Lock()
		f.last = g.GoneThrough
		f.mu.Unlock()
	}
}

// leave unregisters the follow and, on a live connection, unfollows.
func (f *Follow) leave() {
	f.c.mu.Lock()
	delete(f.c.follows, f)
	f.c.mu.Unlock()
	tellLeft(f.leaving(), func(cn *conn) map[string]*Follow { return cn.follows }, f, "unfollow", "follow")
}
