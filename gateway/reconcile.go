package gateway

// After the database changed under the instance (a failover to an
// asynchronous standby may have lost what it committed), the instance
// reconciles its streams' leases with it (internal/server): StreamLeases is
// what its streams hold, and ForgetLostLeases forgets the deliveries whose
// lease the database no longer has.

// StreamLeases returns the ids of the leases this instance's streams hold:
// those of their unacknowledged deliveries (an ack under way included),
// and those a closed SSE stream keeps for a resume.
func (s *Server) StreamLeases() []string {
	seen := map[string]bool{}
	s.deliveries.m.Range(func(k, _ any) bool {
		if id := k.(deliveryKey).leaseID; id != "" {
			seen[id] = true
		}
		return true
	})
	s.graceMu.Lock()
	for id := range s.graceLeases {
		seen[id] = true
	}
	s.graceMu.Unlock()
	out := make([]string, 0, len(seen))
	for id := range seen {
		out = append(out, id)
	}
	return out
}

// ForgetLostLeases forgets every delivery of the streams held under one of
// checked (ids StreamLeases returned) that is not live in the database: a
// pop the database lost, or a lease that ended since. Its stream stops
// waiting for it and gets its credit back (unless an ack of it gave it
// already), as when an ack is refused because its lease is gone; an ack
// of it from the client is then answered "not delivered on this
// connection", and the partition, free in the database, is leased again.
// It returns how many deliveries it forgot.
func (s *Server) ForgetLostLeases(checked []string, live map[string]bool) int {
	lost := map[string]bool{}
	for _, id := range checked {
		if !live[id] {
			lost[id] = true
		}
	}
	if len(lost) == 0 {
		return 0
	}
	var keys []deliveryKey
	s.deliveries.m.Range(func(k, _ any) bool {
		if dk := k.(deliveryKey); lost[dk.leaseID] {
			keys = append(keys, dk)
		}
		return true
	})
	for _, k := range keys {
		s.deliveries.settle(k)
	}
	return len(keys)
}
