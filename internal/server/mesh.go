package server

// Membership: this instance's row in the members table, written every
// MemberBeat and deleted when it stops; the other instances the table
// lists are handed to the syncnet node (its peers), and say whether a
// push must NOTIFY.

import (
	"context"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/internal/tick"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/syncnet"
)

// Membership timings: a new instance is known to all within MemberBeat
// (its first row is written as it starts; the others read every
// MemberBeat); one that stops deletes its row (gone at the others' next
// read); one that dies is gone once its row is MemberDeadAfter old, read
// within MemberBeat after: at most 9 s.
const (
	MemberBeatDefault      = 2 * time.Second
	MemberDeadAfterDefault = 7 * time.Second
)

// A beat reads only the rows changed since the last read (and those gone
// quiet, and those it holds dead: alive again once written, whether or not
// the write moved changed_at): memberChangeMargin before that read's time, so that a row
// changed by a statement that began before the read and committed after
// it is read the next time; and every row every memberFullRead, and at
// once when the count says a row went, which a change read cannot show.
const (
	memberChangeMargin = 10 * time.Second
	memberFullRead     = 30 * time.Second
)

// beatConn runs work on a connection kept open anyway
// (*pgnotify.Listener).
type beatConn interface {
	Do(ctx context.Context, fn func(context.Context, *pgx.Conn) error) error
}

// mesh keeps this instance's row and what the others' say.
type mesh struct {
	store *queue.Store
	node  *syncnet.Node // nil without syncnet
	// on, when set, runs the beat on the instance's LISTEN connection:
	// one backend wakes for the beat and that connection's liveness,
	// which the beat proves (no ping of its own). The pool takes a beat
	// it refuses or fails.
	on        beatConn
	self      queue.Member
	beat      time.Duration
	deadAfter time.Duration
	log       zerolog.Logger

	// kick asks Run to beat now (a stranger spoke on syncnet: a member
	// that just started).
	kick chan struct{}
	// followers, when set, is this instance's follow streams per queue,
	// written with its row every beat.
	followers func() map[string]int
	// onState is called (from Run's goroutine; it must not block) when
	// the maintenance switches' last change differs from the last beat's.
	onState func()
	stateAt time.Time // Run's goroutine only

	// Run's goroutine only: every other row as last read, the database's
	// time of the last read (zero: read every row next), and when every
	// row was last read.
	known  map[string]queue.Member
	readAt time.Time
	fullAt time.Time

	mu      sync.Mutex
	read    bool           // the table was read once
	members []queue.Member // the others alive
}

// Run writes the row every beat until ctx ends, then deletes it.
func (m *mesh) Run(ctx context.Context) error {
	m.beatOnce(ctx)
	t := tick.NewTimer(m.beat) // with the history's sample: one wake-up for both
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			if err := m.store.LeaveMember(lctx, m.self.ID, m.self.Session); err != nil {
				m.log.Warn().Err(err).Msg("leaving the members table; the others drop this instance once its row is old")
			}
			return nil
		case <-t.C:
			m.beatOnce(ctx)
			t.Reset()
		case <-m.kick:
			m.beatOnce(ctx)
		}
	}
}

// beatOnce writes the row and takes in the others.
func (m *mesh) beatOnce(ctx context.Context) {
	self := m.self
	if m.node != nil {
		self.Digest = m.node.Digest()
	}
	if m.followers != nil {
		self.Followers = m.followers()
	}
	b, err := m.readMembers(ctx, self)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn().Err(err).Msg("membership")
		}
		return
	}
	if !b.StateAt.Equal(m.stateAt) {
		// A maintenance switch changed (or this is the first read): the
		// gateway reads them again. Its own periodic read only heals.
		m.stateAt = b.StateAt
		if m.onState != nil {
			m.onState()
		}
	}
	alive := make([]queue.Member, 0, len(m.known))
	for _, o := range m.known {
		if o.Age <= m.deadAfter {
			alive = append(alive, o)
		}
	}
	slices.SortFunc(alive, func(a, b queue.Member) int { return strings.Compare(a.ID, b.ID) })
	m.mu.Lock()
	m.read, m.members = true, alive
	m.mu.Unlock()
	if m.node != nil {
		peers := make([]syncnet.Member, 0, len(alive))
		for _, o := range alive {
			if o.SyncAddr != "" {
				peers = append(peers, syncnet.Member{ID: o.ID, Addr: o.SyncAddr, Session: o.Session, Digest: o.Digest})
			}
		}
		m.node.SetMembers(peers)
	}
}

// readMembers writes the row and reads the rows changed since the last
// read into known (every row when due, or when the count says one went).
func (m *mesh) readMembers(ctx context.Context, self queue.Member) (queue.MemberBeat, error) {
	read := queue.MemberRead{DeadAfter: m.deadAfter}
	if m.known != nil && !m.readAt.IsZero() && time.Since(m.fullAt) < memberFullRead {
		read.Since = m.readAt.Add(-memberChangeMargin)
		for id, o := range m.known {
			if o.Age > m.deadAfter {
				read.Gone = append(read.Gone, id) // alive again once written, changed_at or not
			}
		}
	}
	b, err := m.beatMember(ctx, self, read)
	if err == nil && !read.Since.IsZero() {
		for _, o := range b.Members {
			m.known[o.ID] = o
		}
		if len(m.known) == b.Others {
			m.readAt = b.At
			return b, nil
		}
		read.Since = time.Time{} // a row went: read them all
		b, err = m.beatMember(ctx, self, read)
	}
	if err != nil {
		return b, err
	}
	m.known = make(map[string]queue.Member, len(b.Members))
	for _, o := range b.Members {
		m.known[o.ID] = o
	}
	m.readAt, m.fullAt = b.At, time.Now()
	return b, nil
}

// beatMember writes the row and reads as read asks: on the LISTEN
// connection when there is one that listens, else (or when that fails)
// on the pool.
func (m *mesh) beatMember(ctx context.Context, self queue.Member, read queue.MemberRead) (queue.MemberBeat, error) {
	if m.on != nil {
		var b queue.MemberBeat
		err := m.on.Do(ctx, func(ctx context.Context, conn *pgx.Conn) (err error) {
			b, err = m.store.BeatMemberOn(ctx, conn, self, read)
			return err
		})
		if err == nil || ctx.Err() != nil {
			return b, err
		}
	}
	return m.store.BeatMember(ctx, self, read)
}

// Members are the other instances alive, as last read.
func (m *mesh) Members() []queue.Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]queue.Member(nil), m.members...)
}

// Followers are the follow streams per queue of the other instances alive,
// as of their last beats, added to here (this instance's own, as they are
// now).
func (m *mesh) Followers(here map[string]int) map[string]int {
	out := maps.Clone(here)
	if out == nil {
		out = map[string]int{}
	}
	for _, o := range m.Members() {
		for q, n := range o.Followers {
			out[q] += n
		}
	}
	return out
}

// NeedsNotify is pgnotify.Presence: a push NOTIFYs unless every other
// instance that listens for NOTIFY is a syncnet peer whose presence this
// node knows (the node's Notify then woke those with consumers of the
// queue). Before the table is read, and for an instance without syncnet
// or unreachable over it, it does.
func (m *mesh) NeedsNotify(string) bool {
	m.mu.Lock()
	read, members := m.read, m.members
	m.mu.Unlock()
	if !read || m.node == nil {
		// Without syncnet nothing else wakes anyone: NOTIFY (members
		// only learn of a new instance at their next read).
		return true
	}
	for _, o := range members {
		if o.Listens && (m.node == nil || o.SyncAddr == "" || !m.node.Known(o.ID)) {
			return true
		}
	}
	return false
}

// advertised is the syncnet address peers are told: advertise when set;
// else the bound address when bound to one host; else the local address
// of this instance's connection to the database (the network the
// instances share) with the bound port.
func advertised(ctx context.Context, advertise string, bound *net.UDPAddr, s *Server) string {
	if advertise != "" {
		return advertise
	}
	if bound.IP != nil && !bound.IP.IsUnspecified() {
		return bound.String()
	}
	ip := "127.0.0.1"
	if c, err := s.db.pool.Acquire(ctx); err == nil {
		if a, ok := c.Conn().PgConn().Conn().LocalAddr().(*net.TCPAddr); ok && !a.IP.IsUnspecified() {
			ip = a.IP.String()
		}
		c.Release()
	}
	return net.JoinHostPort(ip, strconv.Itoa(bound.Port))
}
