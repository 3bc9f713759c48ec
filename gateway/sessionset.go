package gateway

import "sync"

// sessionSet is the open sessions of one transport (WebSocket, SSE): what
// Drain and EndStreams go through, and what a connection limit counts. Its
// lock is taken alone, to add, remove or list.
type sessionSet struct {
	mu sync.Mutex
	m  map[*session]bool
}

// add puts ss in the set unless refuse (nil: never) says no; refuse runs
// under the set's lock, so a Drain that lists the set before it returns
// true also sees ss.
func (set *sessionSet) add(ss *session, refuse func() bool) bool {
	set.mu.Lock()
	defer set.mu.Unlock()
	if refuse != nil && refuse() {
		return false
	}
	if set.m == nil {
		set.m = map[*session]bool{}
	}
	set.m[ss] = true
	return true
}

// remove takes ss out of the set.
func (set *sessionSet) remove(ss *session) {
	set.mu.Lock()
	delete(set.m, ss)
	set.mu.Unlock()
}

// list is the sessions in the set now.
func (set *sessionSet) list() []*session {
	set.mu.Lock()
	defer set.mu.Unlock()
	out := make([]*session, 0, len(set.m))
	for ss := range set.m {
		out = append(out, ss)
	}
	return out
}

// len is the number of sessions in the set.
func (set *sessionSet) len() int {
	set.mu.Lock()
	defer set.mu.Unlock()
	return len(set.m)
}
