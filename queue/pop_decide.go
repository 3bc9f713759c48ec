package queue

// The decisions of a pop, with no database. popTx (pop.go) claims consumer
// rows under lock, expireLeases settles the leases that expired on them
// (which moves cursors, so it comes before the messages are read),
// fetchClaimed reads the messages, and decidePop leases what was read.
// Which rows are claimable at all (no live lease, past the window buffer
// and the delay) is decided in popLockSQL, where the index does it in the
// same round trip as the lock.

// expireLeases charges the lease each claimed row still carries (it
// expired: a live one is not claimable) as a failed attempt of the row's
// first pending offset, gives that offset up when it has used up its
// queue's retry limit (dead-lettered, or dropped on a queue whose
// deadPolicy keeps no dead letter of it), and drops the lease. It returns
// the dead letters and counts them per queue in res.DeadLettered (the
// dropped ones in res.Dropped).
func expireLeases(claims []*claimed, group string, res *PopResult) []deadLetter {
	var dead []deadLetter
	for _, c := range claims {
		if c.st.leaseID == "" {
			continue
		}
		// The first pending offset, when inside the lease, was delivered
		// under it and never finished; past the lease's end every leased
		// offset was, and there is nothing to charge.
		if seq := c.st.firstPending(); seq <= c.st.leaseTo {
			if isDead, retries := c.st.fail(seq, c.retryLimit); isDead {
				if c.dead.keeps(true) {
					dead = append(dead, deadLetter{partitionID: c.partitionID, seq: seq, group: group,
						err: "lease expired", retries: retries, exhausted: true})
					res.DeadLettered = countIn(res.DeadLettered, c.queue)
				} else {
					res.Dropped = countIn(res.Dropped, c.queue)
				}
				c.st.markDone(seq)
			}
		}
		c.st.release()
	}
	return dead
}

// popRow is a claimed row to write back; leaseTime ≥ 0 starts a lease of
// that many seconds (0 with autoAck: no lease, but the delivery time is
// recorded), -1 keeps the row's lease columns as they are.
type popRow struct {
	claim     *claimed
	leaseTime int
}

// decidePop leases the messages fetchClaimed put in each claim's msgs:
// under leaseID, over the range of offsets read, for the queue's lease
// time; with req.AutoAck they are marked done instead and no lease is kept.
// It fills res (the first partition leased names it) and returns the rows
// to write: every row that changed, here or in expireLeases.
func decidePop(claims []*claimed, req *PopRequest, leaseID string, res *PopResult) []popRow {
	var rows []popRow
	for _, c := range claims {
		leased := len(c.msgs) > 0
		if leased {
			if req.AutoAck {
				for _, m := range c.msgs {
					c.st.markDone(m.Offset)
				}
			} else {
				c.st.leaseID = leaseID
				c.st.leaseFrom = c.msgs[0].Offset
				c.st.leaseTo = c.msgs[len(c.msgs)-1].Offset
				c.st.changed = true
			}
			if res.PartitionsClaimed == 0 {
				res.Queue, res.Partition, res.PartitionID = c.queue, c.partition, c.partitionID
			}
			res.PartitionsClaimed++
			res.Messages = append(res.Messages, c.msgs...)
		}
		switch {
		case leased && !req.AutoAck:
			rows = append(rows, popRow{c, c.leaseTime})
		case leased:
			rows = append(rows, popRow{c, 0})
		case c.st.changed:
			rows = append(rows, popRow{c, -1})
		}
	}
	if res.PartitionsClaimed > 0 {
		res.LeaseID = leaseID
	}
	return rows
}

// countIn adds one to m[q], making m if it is nil.
func countIn(m map[string]int, q string) map[string]int {
	if m == nil {
		m = map[string]int{}
	}
	m[q]++
	return m
}
