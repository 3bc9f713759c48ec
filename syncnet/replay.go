package syncnet

import (
	"slices"
	"sync"
	"time"
)

// Replay decides which verified datagrams are new. The reference server
// keeps per sender (session, highest sequence) and takes any session other
// than the last as a restart, so datagrams captured on either side of a
// restart and replayed alternately were all accepted.
//
// The session id is random: nothing in it orders sessions. What is signed
// and carries time is the payload's ts (ms since the Unix epoch, the
// sender's clock) of HEARTBEAT, MESSAGE_AVAILABLE, CONSUMER_REGISTERED and
// _DEREGISTERED and the maintenance modes; the reference server writes it
// too. Replay orders a sender's sessions by it:
//
//   - A datagram that carries a ts further than the freshness window from
//     this instance's clock, either way, is dropped: stale_timestamp.
//   - Within the current session a sequence at or below the highest
//     accepted is dropped: replay. Gaps are allowed (datagrams get lost).
//   - A session is adopted (a first contact, or a restart) only by a datagram
//     that carries a ts, and a restart only when that ts is later than every
//     ts the current session carried: the restarted process reads the same
//     clock later. A datagram without a ts from a session not adopted is
//     dropped: unknown_session (the sender's first heartbeat, at most a
//     heartbeat later, adopts it).
//   - The superseded session is retired; datagrams of a retired session, or
//     of an unknown one whose ts is not later, are dropped: stale_session.
//
// So a replayed datagram of an older session is refused whatever its
// sequence, and a session never seen gets in only with a fresh ts (within
// the window). Should the sender's clock step back across a restart, its
// new session is refused until its ts passes the old session's highest,
// and never for longer than twice the window: that highest was within the
// window of this clock when it arrived, so a fresh ts exceeds it once the
// old session has been silent that long.
type Replay struct {
	mu      sync.Mutex
	window  time.Duration
	senders map[string]*replayState
}

// RetiredMax is how many superseded sessions are remembered per sender
// (older ones are also refused by their ts, while the clock holds).
const RetiredMax = 16

type replayState struct {
	session string
	max     uint64   // highest sequence accepted
	maxTS   uint64   // highest ts the session carried, ms
	retired []string // superseded sessions, oldest first
}

// NewReplay returns an empty Replay whose freshness window is window
// (FreshnessDefault when zero).
func NewReplay(window time.Duration) *Replay {
	if window <= 0 {
		window = FreshnessDefault
	}
	return &Replay{window: window, senders: map[string]*replayState{}}
}

// Check reports why a datagram must be dropped ("" when it is new, and then
// records it): stale_timestamp, replay, unknown_session or stale_session.
// ts is the payload's, when stamped (the type carries one); now is this
// instance's clock.
func (r *Replay) Check(sender, session string, seq uint64, ts uint64, stamped bool, now time.Time) string {
	if stamped {
		at := time.UnixMilli(int64(ts)) // #nosec G115 -- a timestamp; absurd ones fail the window
		if ts > uint64(1<<62) || at.Before(now.Add(-r.window)) || at.After(now.Add(r.window)) {
			return "stale_timestamp"
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.senders[sender]
	switch {
	case st == nil && !stamped:
		return "unknown_session"
	case st == nil:
		r.senders[sender] = &replayState{session: session, max: seq, maxTS: ts}
		return ""
	case st.session == session:
		if seq <= st.max {
			return "replay"
		}
		st.max = seq
		st.maxTS = max(st.maxTS, ts)
		return ""
	case slices.Contains(st.retired, session):
		return "stale_session"
	case !stamped:
		return "unknown_session"
	case ts <= st.maxTS:
		return "stale_session"
	}
	// A restart.
	st.retired = append(st.retired, st.session)
	if len(st.retired) > RetiredMax {
		st.retired = slices.Delete(st.retired, 0, len(st.retired)-RetiredMax)
	}
	st.session, st.max, st.maxTS = session, seq, ts
	return ""
}

// stampOf reads the signed ts of the types that carry one (the reference
// server's HEARTBEAT, MESSAGE_AVAILABLE and maintenance modes, and Herald's
// presence); a missing one reads 0, which no window admits.
func stampOf(p Packet) (ts uint64, stamped bool, err error) {
	switch p.Type {
	case Heartbeat, MessageAvailable, ConsumerRegistered, ConsumerDeregistered, MaintenanceModeSet, PopMaintenanceModeSet,
		PresenceSet, PresencePull:
	default:
		return 0, false, nil
	}
	var m struct {
		TS uint64 `msgpack:"ts"`
	}
	if err := Unmarshal(p.Payload, &m); err != nil {
		return 0, true, err
	}
	return m.TS, true, nil
}
