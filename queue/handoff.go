package queue

// A HandOff gives a push the consumers waiting on this instance, so that
// the push leases its messages to them in its own transaction: the
// consumer gets them when the commit returns, with no wake-up, no
// pre-flight and no pop of their own (docs/design.md, "Hand-off").
//
// The poller implements it; SetHandOff installs it. The database decides:
// a reservation becomes a lease only if the group's consumer row is caught
// up to the push (every earlier message done, no lease), on a queue with no
// delay and no window buffer. Anything else is left to the poll cycle.
type HandOff interface {
	// Reserve picks, among the consumers waiting for the pushed
	// partitions, at most one per (partition, group), and holds their
	// credit until Settle. It must not block.
	Reserve(parts []PushedPartition) []Reservation
	// Settle follows every reservation once the push is over: res holds
	// the messages leased to it (deliver them), or is nil when nothing was
	// leased (the push failed, or the row was not caught up), or when the
	// push's answer was lost (r.OutcomeUnknown: it may have committed the
	// lease r.LeaseID, which the HandOff gives back).
	Settle(r Reservation, res *PopResult)
}

// PushedPartition is a partition a push is about to write.
type PushedPartition struct {
	Queue, Partition, PartitionID string
	Messages                      int // fresh items for it (duplicates may take fewer)
}

// Reservation is one waiting consumer a push may lease to.
type Reservation struct {
	PartitionID string
	Group       string
	LeaseID     string
	Limit       int    // the most messages to lease to it
	Subject     string // who the consumer is (its token's sub); "" for none
	// AutoAck: the push moves the group's cursor past what it hands off
	// (no lease; LeaseID is unused).
	AutoAck bool
	// Stream: the lease is for a stream of this instance (a WebSocket or
	// SSE subscription); false: for a client that holds it itself (a
	// long-poll), which outlives a restart of this instance
	// (Assignment.Stream, Store.leaseOwner).
	Stream bool
	// Extend, when set, is the lease a stream of this instance holds on
	// the partition: the push extends it over its messages when it covers
	// every earlier one (its end at the partition's last offset, live), and
	// its consumer gets them without waiting for its acks of what the lease
	// holds already; when that lease has ended, the push leases LeaseID as
	// for any reservation.
	Extend string
	// Follow: the consumer is a stream that may hold a lease following the
	// partition (docs/design.md, "Hand-off"): a lease the push takes for it
	// with all the push's messages follows, and later pushes here hand it
	// theirs without writing the row (Extend names it).
	Follow bool
	Token  any // the HandOff's own
	// OutcomeUnknown: the push failed after it was sent, and may have
	// committed (OutcomeUnknown(err)); set for Settle.
	OutcomeUnknown bool
}

// SetHandOff installs h (nil removes it). Call it before the store serves.
func (s *Store) SetHandOff(h HandOff) {
	if h == nil {
		s.handOff.Store(nil)
		return
	}
	s.handOff.Store(&h)
}

// installedHandOff returns the installed HandOff, or nil.
func (s *Store) installedHandOff() HandOff {
	if h := s.handOff.Load(); h != nil {
		return *h
	}
	return nil
}

// reserve asks the HandOff for consumers of plan's partitions, keeping the
// hand-offs in the plan for the push statement.
func (s *Store) reserve(plan *pushPlan) {
	h := s.installedHandOff()
	if h == nil || len(plan.rowIdx) == 0 {
		return
	}
	count := map[string]int{}
	var parts []PushedPartition
	for _, i := range plan.rowIdx {
		r := plan.results[i]
		if count[r.PartitionID] == 0 {
			parts = append(parts, PushedPartition{Queue: r.Queue, Partition: r.Partition, PartitionID: r.PartitionID})
		}
		count[r.PartitionID]++
	}
	for i := range parts {
		parts[i].Messages = count[parts[i].PartitionID]
	}
	plan.handOff = h
	plan.reserved = h.Reserve(parts)
}

// settle tells the HandOff how each reservation ended; err is the push's
// (nil: it committed, and handed holds what its statement leased).
func (p *pushPlan) settle(err error, items []PushItem) {
	if p.handOff == nil {
		return
	}
	unknown := OutcomeUnknown(err)
	for _, r := range p.reserved {
		var res *PopResult
		if err == nil {
			res = p.handedResult(r, items)
		}
		r.OutcomeUnknown = unknown
		p.handOff.Settle(r, res)
	}
}

// handedLease is one lease the push statement took for a reservation, or
// extended (Reservation.Extend).
type handedLease struct {
	from, to int64
	extended bool
}

// handedResult builds the delivery of reservation r from the pushed items,
// or nil when the statement leased nothing for it.
func (p *pushPlan) handedResult(r Reservation, items []PushItem) *PopResult {
	l, ok := p.handed[consumerKey{r.PartitionID, r.Group}]
	if !ok {
		return nil
	}
	lease := r.LeaseID
	switch {
	case r.AutoAck:
		lease = ""
	case l.extended:
		lease = r.Extend
	}
	res := &PopResult{LeaseID: lease, Group: r.Group, PartitionID: r.PartitionID, PartitionsClaimed: 1}
	// The fresh rows of the partition, in item order, took the offsets
	// after the partition's last one before the push: the lease starts at
	// the first of them.
	seq := l.from
	for _, i := range p.rowIdx {
		pr := p.results[i]
		if pr.PartitionID != r.PartitionID || pr.Status != StatusQueued {
			continue
		}
		if seq > l.to {
			res.More = true
			break
		}
		it := items[i]
		data := it.Payload
		if data == nil {
			data = []byte("{}")
		}
		res.Queue, res.Partition = pr.Queue, pr.Partition
		res.Messages = append(res.Messages, Message{ID: pr.MessageID, TransactionID: pr.TransactionID, TraceID: it.TraceID,
			Data: data, ProducerSub: it.ProducerSub, CreatedAt: p.created[pr.PartitionID][seq], PartitionID: pr.PartitionID,
			Partition: pr.Partition, Queue: pr.Queue, LeaseID: lease, Group: r.Group, Offset: seq})
		seq++
	}
	if len(res.Messages) == 0 {
		return nil
	}
	return res
}

// handOffArgs are the push insert's hand-off parameters; owner names the
// owner of a lease for a stream or not (Store.leaseOwner).
func (p *pushPlan) handOffArgs(owner func(stream bool) string) (pids, groups, leases []string, limits []int32, subjects []*string,
	auto []bool, owners []string, extend []*string, follow []bool,
) {
	for _, r := range p.reserved {
		pids = append(pids, r.PartitionID)
		groups = append(groups, r.Group)
		leases = append(leases, r.LeaseID)
		limits = append(limits, int32(r.Limit))
		subjects = append(subjects, optString(r.Subject))
		auto = append(auto, r.AutoAck)
		owners = append(owners, owner(r.Stream))
		extend = append(extend, optString(r.Extend))
		follow = append(follow, r.Follow)
	}
	return pids, groups, leases, limits, subjects, auto, owners, extend, follow
}

// leaseEnd is the end of the lease of consumer row c in SQL: its lease_to,
// or for a lease that follows its partition (follow_lease, migration 0022)
// the partition's last offset, every message up to which went to its
// stream. Everything that judges what a lease holds (an ack's range, an
// expiry's attempt, a pop's or a view's leased messages) reads this.
func leaseEnd(c string) string {
	return `CASE WHEN ` + c + `.follow_lease = ` + c + `.lease_id THEN greatest(` + c + `.lease_to,
	(SELECT fp.last_offset FROM partitions fp WHERE fp.id = ` + c + `.partition_id)) ELSE ` + c + `.lease_to END`
}
