package queue_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// subjectOf reads who the group's last lease on partition pid was for.
func subjectOf(t *testing.T, s *queue.Store, pid string) *string {
	t.Helper()
	var sub *string
	require.NoError(t, s.Pool().QueryRow(ctxT(t),
		`SELECT lease_subject FROM consumers WHERE partition_id = $1 AND consumer_group = $2`, pid, queue.DefaultGroup).Scan(&sub))
	return sub
}

// handTo is a HandOff that reserves every pushed partition for one
// consumer of subject sub, and keeps what was leased to it.
type handTo struct {
	sub string
	mu  sync.Mutex
	got []*queue.PopResult
}

func (h *handTo) Reserve(parts []queue.PushedPartition) []queue.Reservation {
	var out []queue.Reservation
	for _, p := range parts {
		out = append(out, queue.Reservation{PartitionID: p.PartitionID, Group: queue.DefaultGroup, LeaseID: queue.NewID(),
			Limit: p.Messages, Subject: h.sub})
	}
	return out
}

func (h *handTo) Settle(_ queue.Reservation, res *queue.PopResult) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if res != nil {
		h.got = append(h.got, res)
	}
}

// Every way a lease is made records the subject it was made for
// (Pop, PopAssigned, PopClaim, a push's hand-off), and every way a lease is
// acted on refuses another non-admin subject: Ack (named lease or none),
// ExtendLease, Transaction (its acks and its required leases) and
// ResumeLeases. Holder "" (an admin, auth off) is never refused; a lease
// made for no subject binds nothing.
func TestLease_EveryWayRecordsItsSubject(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	leaseBy := map[string]func(q string) *queue.PopResult{
		"pop": func(q string) *queue.PopResult {
			push(t, s, q, "", nums(1, 1)...)
			return pop(t, s, queue.PopRequest{Queue: q, Subject: "bob"})
		},
		"assigned": func(q string) *queue.PopResult {
			push(t, s, q, "", nums(1, 1)...)
			require.NoError(t, s.EnsureConsumers(ctx, []queue.Target{{Queue: q}}))
			av, err := s.Preflight(ctx, []queue.Target{{Queue: q}})
			require.NoError(t, err)
			require.Len(t, av, 1)
			got, err := s.PopAssigned(ctx, []queue.Assignment{{Intention: 1, PartitionID: av[0].PartitionID, Limit: 1, Total: 1,
				LeaseID: queue.NewID(), Subject: "bob"}})
			require.NoError(t, err)
			return got[1]
		},
		"claim": func(q string) *queue.PopResult {
			push(t, s, q, "", nums(1, 1)...)
			require.NoError(t, s.EnsureConsumers(ctx, []queue.Target{{Queue: q}}))
			got, err := s.PopClaim(ctx, queue.Claim{Intention: 2, Queue: q, Limit: 1, Total: 1, LeaseID: queue.NewID(), Subject: "bob"})
			require.NoError(t, err)
			return got[2]
		},
		"hand-off": func(q string) *queue.PopResult {
			require.NoError(t, s.EnsureConsumers(ctx, []queue.Target{{Queue: q}}))
			h := &handTo{sub: "bob"}
			s.SetHandOff(h)
			defer s.SetHandOff(nil)
			push(t, s, q, "", nums(1, 1)...)
			require.Len(t, h.got, 1)
			return h.got[0]
		},
	}
	for how, lease := range leaseBy {
		q := "subj-" + how
		if how == "hand-off" {
			// The group must be caught up to the push: register it first.
			_, err := s.Configure(ctx, queue.ConfigureRequest{Queue: q})
			require.NoError(t, err)
		}
		res := lease(q)
		require.NotNil(t, res, how)
		require.Len(t, res.Messages, 1, how)
		m := res.Messages[0]
		require.NotEmpty(t, m.LeaseID, how)
		sub := subjectOf(t, s, m.PartitionID)
		require.NotNil(t, sub, how)
		assert.Equal(t, "bob", *sub, how)

		ack := queue.Ack{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID}
		foreign := ack
		foreign.Holder = "alice"
		out, err := s.Ack(ctx, []queue.Ack{foreign})
		require.NoError(t, err)
		assert.Equal(t, queue.ErrTextForeign, out[0].Error, how)

		ext, err := s.ExtendLease(ctx, m.LeaseID, 60, "alice")
		require.NoError(t, err)
		assert.Equal(t, queue.ErrTextLeaseForeign, ext.Error, how)
		assert.False(t, ext.Success, how)
		ext, err = s.ExtendLease(ctx, m.LeaseID, 60, "bob")
		require.NoError(t, err)
		assert.True(t, ext.Success, how)

		tx, err := s.Transaction(ctx, []queue.TxOp{{Type: "ack", Ack: ack}}, nil, "alice")
		require.NoError(t, err)
		assert.True(t, tx.Forbidden, how)
		tx, err = s.Transaction(ctx, []queue.TxOp{{Type: "ack", Ack: queue.Ack{TransactionID: m.TransactionID,
			PartitionID: m.PartitionID}}}, []string{m.LeaseID}, "alice")
		require.NoError(t, err)
		assert.True(t, tx.Forbidden, "a required lease of another: %s", how)
		assert.False(t, tx.Success, how)

		_, err = s.ResumeLeases(ctx, "", []queue.LeaseMark{{PartitionID: m.PartitionID, LeaseID: m.LeaseID, Through: m.Offset}}, "alice")
		assert.True(t, errors.Is(err, queue.ErrForeign), "%s: %v", how, err)

		// Still bob's, untouched: he (or Holder "", an admin) acks it.
		own := ack
		own.Holder = "bob"
		if how == "claim" {
			own.Holder = "" // an admin
		}
		out, err = s.Ack(ctx, []queue.Ack{own})
		require.NoError(t, err)
		assert.True(t, out[0].Success, "%s: %s", how, out[0].Error)
		assert.True(t, out[0].LeaseReleased, how)
	}

	// A late ack naming no lease is checked against the last delivery;
	// the binding outlives the lease. An autoAck delivery makes no lease
	// and leaves the binding; a delivery for no subject binds nothing.
	push(t, s, "late", "", nums(1, 3)...)
	m := pop(t, s, queue.PopRequest{Queue: "late", Subject: "bob"}).Messages[0]
	exec(t, s, `UPDATE consumers SET lease_expires_at = now() - interval '1 second'`)
	out, err := s.Ack(ctx, []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, Holder: "alice"}})
	require.NoError(t, err)
	assert.Equal(t, queue.ErrTextForeign, out[0].Error)
	out, err = s.Ack(ctx, []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, Holder: "bob"}})
	require.NoError(t, err)
	assert.True(t, out[0].Success, out[0].Error)
	pop(t, s, queue.PopRequest{Queue: "late", Subject: "carol", AutoAck: true})
	assert.Equal(t, "bob", *subjectOf(t, s, m.PartitionID), "autoAck leases nothing")
	m = pop(t, s, queue.PopRequest{Queue: "late"}).Messages[0]
	assert.Nil(t, subjectOf(t, s, m.PartitionID), "a delivery for no subject binds nothing")
	out, err = s.Ack(ctx, []queue.Ack{{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID, Holder: "alice"}})
	require.NoError(t, err)
	assert.True(t, out[0].Success, out[0].Error)
}
