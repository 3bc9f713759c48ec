package syncnet

import "sync"

// Replay rejects datagrams seen before: per sender id it keeps the session
// and the highest sequence accepted. The first datagram of a sender, and
// the first of a new session (a restart), are accepted whatever their
// sequence; within a session a sequence at or below the highest is a replay.
// Gaps are allowed (datagrams get lost).
type Replay struct {
	mu      sync.Mutex
	senders map[string]replayState
}

type replayState struct {
	session string
	max     uint64
}

// NewReplay returns an empty Replay.
func NewReplay() *Replay { return &Replay{senders: map[string]replayState{}} }

// Accept reports whether a datagram is new, and records it if so.
func (r *Replay) Accept(sender, session string, seq uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, seen := r.senders[sender]
	if seen && st.session == session && seq <= st.max {
		return false
	}
	r.senders[sender] = replayState{session: session, max: seq}
	return true
}

// Forget drops a sender (it was declared dead and its state aged out).
func (r *Replay) Forget(sender string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.senders, sender)
}
