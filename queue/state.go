package queue

import (
	"slices"
	"strconv"
	"strings"
)

// cursorState is one (partition, group) consumer row in memory: the pure part
// of the delivery semantics, shared by pop and ack so both apply the same
// rules. It is read under the row lock, changed here, and written back.
//
//	cursor ─┐      done (acked above the cursor)
//	        ▼       ▼   ▼
//	… 7 8 9 │ 10  11  12  13 … last_offset
//	        │ └─── lease_from..lease_to ───┘
type cursorState struct {
	cursor     int64
	done       []int64 // sorted, all > cursor
	leaseID    string  // "" when no lease
	leaseFrom  int64
	leaseTo    int64
	attempts   int   // failed deliveries of attemptSeq
	attemptSeq int64 // the offset the attempts belong to
	changed    bool  // needs writing back
}

// isDone reports whether seq is finished for the group.
func (s *cursorState) isDone(seq int64) bool {
	if seq <= s.cursor {
		return true
	}
	_, found := slices.BinarySearch(s.done, seq)
	return found
}

// markDone records seq as finished and moves the cursor over the contiguous
// finished prefix. Attempts of a finished offset start again for the next one.
func (s *cursorState) markDone(seq int64) {
	if s.isDone(seq) {
		return
	}
	s.changed = true
	i, _ := slices.BinarySearch(s.done, seq)
	s.done = slices.Insert(s.done, i, seq)
	n := 0
	for n < len(s.done) && s.done[n] == s.cursor+1 {
		s.cursor++
		n++
	}
	s.done = s.done[n:]
	if s.attemptSeq != 0 && s.isDone(s.attemptSeq) {
		s.attempts, s.attemptSeq = 0, 0
	}
}

// retryCount is how many failed deliveries seq has had.
func (s *cursorState) retryCount(seq int64) int {
	if s.attemptSeq == seq {
		return s.attempts
	}
	return 0
}

// fail counts a failed delivery of seq. It reports true when seq has used up
// retryLimit retries and must go to the dead-letter queue; the caller then
// dead-letters it and calls markDone. retries is the count before this failure.
//
// The row counts the attempts of one offset: an earlier one still
// unfinished keeps them (it comes again first, and reaches its limit
// first), and a later one's failure then counts nothing. Moving the count
// to the later one would let a consumer that fails every message of its
// batch reset each one's count in turn: none would ever reach its limit.
func (s *cursorState) fail(seq int64, retryLimit int) (dead bool, retries int) {
	if s.attemptSeq != 0 && s.attemptSeq < seq && !s.isDone(s.attemptSeq) {
		return false, 0
	}
	s.changed = true
	n := s.retryCount(seq)
	if n >= retryLimit {
		return true, n
	}
	s.attempts, s.attemptSeq = n+1, seq
	return false, n
}

// leaseComplete reports whether every offset of the current lease is done.
func (s *cursorState) leaseComplete() bool {
	if s.leaseID == "" {
		return false
	}
	for seq := max(s.leaseFrom, s.cursor+1); seq <= s.leaseTo; seq++ {
		if !s.isDone(seq) {
			return false
		}
	}
	return true
}

// release drops the lease; unfinished offsets become available again.
func (s *cursorState) release() {
	if s.leaseID == "" {
		return
	}
	s.leaseID, s.leaseFrom, s.leaseTo = "", 0, 0
	s.changed = true
}

// firstPending is the first unfinished offset; the one an expired lease's
// failed attempt is charged to.
func (s *cursorState) firstPending() int64 { return s.cursor + 1 }

// doneLiteral renders done as a Postgres array literal, because pgx cannot
// send a jagged bigint[][] through unnest.
func (s *cursorState) doneLiteral() string {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range s.done {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(v, 10))
	}
	b.WriteByte('}')
	return b.String()
}
