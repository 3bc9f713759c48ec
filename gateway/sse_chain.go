package gateway

import (
	"crypto/rand"
	"time"
)

// A browser's SSE streams follow one another: EventSource reconnects by
// itself, and the browser SDK reopens its stream to send a fresh token,
// each time resuming with the id of the last event the page received. A
// stream that closes keeps what it wrote and was not acked for the resume
// grace (Config.SSEResumeGrace), because its page may come back with a
// token that covers it. When the page is back on this instance (a newer
// stream of the same chain), what the closed stream wrote past the new
// stream's token never reached the page (a reopen may close a stream just
// after the server wrote to it): it is given back at once, so that the new
// stream receives it now rather than after the grace.
//
// A chain is known by the origin its resume tokens carry (sse_token.go):
// a stream resumed with a token of the chain joins it as its newest, a
// stream without one starts a chain. Its key also holds the token's
// holder, so a token learned out of band cannot hurry another subject's
// leases. Only this instance's streams: a page that comes back to another
// instance finds them there after the grace, as before.
//
//	stream 1 ── closes ──▶ its leases kept (grace) ─┐
//	stream 2 (resumes with a token of 1) joins ─────┴─▶ released at once
//	stream 2 joins, then stream 1 closes ─────────────▶ released at once

// sseChain is this instance's streams of one chain, under Server.graceMu.
type sseChain struct {
	newest uint64               // the number of its newest stream
	open   int                  // its streams joined and not yet closed
	grace  map[*time.Timer]bool // its closed streams' leases kept for a resume (keys of Server.grace)
}

// chainRef is a stream's place in its chain; the zero value is no chain.
type chainRef struct {
	key string // origin and holder (chainKey)
	n   uint64 // the stream's number: a higher one is newer
}

// newOrigin draws the origin of a new chain.
func newOrigin() streamOrigin {
	var o streamOrigin
	_, _ = rand.Read(o[:]) // never fails (crypto/rand)
	return o
}

func chainKey(origin streamOrigin, holder string) string {
	return string(origin[:]) + holder
}

// joinChain counts a stream that opens into its chain as the newest.
func (s *Server) joinChain(key string) chainRef {
	s.graceMu.Lock()
	defer s.graceMu.Unlock()
	c := s.chainLocked(key)
	s.streamSeq++
	c.newest = s.streamSeq
	c.open++
	return chainRef{key: key, n: s.streamSeq}
}

// leaveChain counts a closed stream out of its chain.
func (s *Server) leaveChain(ref chainRef) {
	s.graceMu.Lock()
	defer s.graceMu.Unlock()
	if c := s.chains[ref.key]; c != nil {
		c.open--
		s.dropIdleLocked(ref.key, c)
	}
}

// resumedChain gives back at once what the closed streams of ref's chain
// keep for a resume: ref's stream, which has resumed, is their page back.
// Call it after the resume's marks took (resumeSSE): those ack what the
// page received of them first.
func (s *Server) resumedChain(ref chainRef) {
	var release []func()
	s.graceMu.Lock()
	if c := s.chains[ref.key]; c != nil {
		for t := range c.grace {
			if f, pending := s.grace[t]; pending {
				delete(s.grace, t)
				if t.Stop() {
					s.graceWG.Done() // its func will not run
				}
				release = append(release, f)
			}
		}
		c.grace = nil
		s.dropIdleLocked(ref.key, c)
	}
	s.graceMu.Unlock()
	for _, f := range release {
		f()
	}
}

// newerInChainLocked reports whether a stream newer than ref's has joined
// its chain: the page is back, and what ref's stream kept is not waited
// for. Called with graceMu.
func (s *Server) newerInChainLocked(ref chainRef) bool {
	c := s.chains[ref.key]
	return c != nil && c.newest > ref.n
}

// keptInChainLocked notes a lease kept for a resume (its grace timer) in
// ref's chain; forgetKeptLocked takes it out when the timer fires. Called
// with graceMu.
func (s *Server) keptInChainLocked(ref chainRef, t *time.Timer) {
	if ref.key == "" {
		return
	}
	c := s.chainLocked(ref.key)
	if c.grace == nil {
		c.grace = map[*time.Timer]bool{}
	}
	c.grace[t] = true
}

func (s *Server) forgetKeptLocked(ref chainRef, t *time.Timer) {
	if c := s.chains[ref.key]; c != nil {
		delete(c.grace, t)
		s.dropIdleLocked(ref.key, c)
	}
}

// chainLocked is key's chain, made when it has none. Called with graceMu.
func (s *Server) chainLocked(key string) *sseChain {
	c := s.chains[key]
	if c == nil {
		c = &sseChain{}
		s.chains[key] = c
	}
	return c
}

// dropIdleLocked forgets a chain with no open stream and nothing kept.
func (s *Server) dropIdleLocked(key string, c *sseChain) {
	if c.open <= 0 && len(c.grace) == 0 {
		delete(s.chains, key)
	}
}
