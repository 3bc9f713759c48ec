package queue

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// claim is a claimed row of queue q on partition pid, after cursor 10,
// with 3 retries and a 30 s lease time; msgs are the offsets read.
func claim(pid string, st cursorState, msgs ...int64) *claimed {
	c := &claimed{partitionID: pid, partition: "part-" + pid, queue: "q", st: st, leaseTime: 30, retryLimit: 3}
	for _, o := range msgs {
		c.msgs = append(c.msgs, Message{Offset: o, PartitionID: pid})
	}
	return c
}

func TestDecidePop_ExpiredLeases(t *testing.T) {
	cases := []struct {
		name     string
		st       cursorState
		want     cursorState // changed aside
		dead     []int64
		deadByQ  int
		charged  bool
		released bool
	}{{
		name: "RetriesLeftCountsAnAttempt",
		st:   cursorState{cursor: 10, leaseID: "L1", leaseFrom: 11, leaseTo: 13},
		want: cursorState{cursor: 10, attempts: 1, attemptSeq: 11},
	}, {
		name: "OneMoreFailureOfTheSameOffset",
		st:   cursorState{cursor: 10, leaseID: "L1", leaseFrom: 11, leaseTo: 13, attempts: 2, attemptSeq: 11},
		want: cursorState{cursor: 10, attempts: 3, attemptSeq: 11},
	}, {
		name: "RetriesExhaustedDeadLetters",
		st:   cursorState{cursor: 10, done: []int64{12}, leaseID: "L1", leaseFrom: 11, leaseTo: 13, attempts: 3, attemptSeq: 11},
		// 11 goes to the DLQ; the cursor passes it and the 12 done before.
		want: cursorState{cursor: 12, done: []int64{}},
		dead: []int64{11}, deadByQ: 1,
	}, {
		name: "AttemptsOfAnotherOffsetStartAgain",
		st:   cursorState{cursor: 11, leaseID: "L1", leaseFrom: 11, leaseTo: 13, attempts: 3, attemptSeq: 11},
		want: cursorState{cursor: 11, attempts: 1, attemptSeq: 12},
	}, {
		name: "EverythingLeasedWasAckedNothingCharged",
		st:   cursorState{cursor: 13, leaseID: "L1", leaseFrom: 11, leaseTo: 13},
		want: cursorState{cursor: 13},
	}, {
		name: "NoLeaseUntouched",
		st:   cursorState{cursor: 10, attempts: 1, attemptSeq: 11},
		want: cursorState{cursor: 10, attempts: 1, attemptSeq: 11},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cl := claim("p1", c.st)
			res := &PopResult{}
			dead := expireLeases([]*claimed{cl}, "g", res)
			got := cl.st
			got.changed = false
			assert.Equal(t, c.want, got)
			var seqs []int64
			for _, d := range dead {
				seqs = append(seqs, d.seq)
				assert.Equal(t, "lease expired", d.err)
				assert.Equal(t, "g", d.group)
				assert.Equal(t, 3, d.retries, "the attempts it had")
			}
			assert.Equal(t, c.dead, seqs)
			assert.Equal(t, c.deadByQ, res.DeadLettered["q"])
			assert.Equal(t, c.st.leaseID != "", cl.st.changed, "written back when a lease was dropped")
		})
	}
}

func TestDecidePop_Lease(t *testing.T) {
	req := &PopRequest{Group: "g"}
	a := claim("p1", cursorState{cursor: 10}, 11, 12)
	// Out of order: 13 was done, so the messages read are 12 and 14; the
	// lease spans them, 13 included (done, it needs no ack).
	b := claim("p2", cursorState{cursor: 11, done: []int64{13}}, 12, 14)
	empty := claim("p3", cursorState{cursor: 10})
	res := &PopResult{}
	rows := decidePop([]*claimed{empty, a, b}, req, "L9", res)

	assert.Equal(t, "L9", res.LeaseID)
	assert.Equal(t, 2, res.PartitionsClaimed)
	assert.Equal(t, [3]string{"q", "part-p1", "p1"}, [3]string{res.Queue, res.Partition, res.PartitionID},
		"the first partition leased names the result")
	assert.Len(t, res.Messages, 4)
	assert.Equal(t, cursorState{cursor: 10, leaseID: "L9", leaseFrom: 11, leaseTo: 12, changed: true}, a.st)
	assert.Equal(t, cursorState{cursor: 11, done: []int64{13}, leaseID: "L9", leaseFrom: 12, leaseTo: 14, changed: true}, b.st)
	assert.Equal(t, []popRow{{a, 30}, {b, 30}}, rows, "a claim with nothing read and nothing changed is not written")
}

func TestDecidePop_AutoAck(t *testing.T) {
	req := &PopRequest{Group: "g", AutoAck: true}
	a := claim("p1", cursorState{cursor: 10, done: []int64{12}}, 11, 13)
	res := &PopResult{}
	rows := decidePop([]*claimed{a}, req, "", res)
	assert.Empty(t, res.LeaseID)
	assert.Equal(t, cursorState{cursor: 13, done: []int64{}, changed: true}, a.st, "done at delivery, no lease")
	assert.Equal(t, []popRow{{a, 0}}, rows, "leased_at records the delivery")
}

// A claim whose expired lease was dropped, with nothing to read now (the
// next message is delayed), is written back without a new lease.
func TestDecidePop_ExpiredWithNothingRead(t *testing.T) {
	a := claim("p1", cursorState{cursor: 10, leaseID: "L1", leaseFrom: 11, leaseTo: 11})
	res := &PopResult{}
	expireLeases([]*claimed{a}, "g", res)
	rows := decidePop([]*claimed{a}, &PopRequest{Group: "g"}, "L2", res)
	assert.Empty(t, res.LeaseID, "nothing leased")
	assert.Zero(t, res.PartitionsClaimed)
	assert.Equal(t, []popRow{{a, -1}}, rows)
	assert.Empty(t, a.st.leaseID)
}
