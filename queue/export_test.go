package queue

// AckResolveSQL is exported for the plan test.
const AckResolveSQL = ackResolveSQL

// AckQueued is how many Ack calls wait for a turn in a merged transaction.
func (s *Store) AckQueued() int {
	s.acks.mu.Lock()
	defer s.acks.mu.Unlock()
	return len(s.acks.queue)
}

// AckRunning is how many ack transactions are in flight.
func (s *Store) AckRunning() int {
	s.acks.mu.Lock()
	defer s.acks.mu.Unlock()
	return s.acks.running
}
