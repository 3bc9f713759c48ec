package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lease extension errors reported in results.
const (
	ErrTextLeaseNotFound = "Lease not found"
	ErrTextLeaseExpired  = "Lease already expired"
	// ErrTextLeaseForeign: the lease is another subject's (see Ack.Holder).
	ErrTextLeaseForeign = "Forbidden: the lease is held by another subject"
)

// MaxLeaseSeconds bounds every lease duration: a queue's leaseTime and an
// extension's seconds (one day). A longer value is refused, never narrowed:
// a lease pinned for years is a partition nobody else can read.
const MaxLeaseSeconds = 24 * 60 * 60

// extendLeaseSQL pushes the expiry of the live rows of lease $1 to now +
// $2 seconds (NULL: the queue's lease time), for holder $3 (NULL: any).
// A lease of a multi-partition pop spans several consumer rows: they are
// locked first in key order (lk), as pushes and acks lock them; updated in
// the order of the lease_id index, a push's marking or an ack holding one
// and waiting for another deadlocked with it (40P01: one of them failed).
const extendLeaseSQL = `-- herald:extend_lease
WITH lk AS (
	SELECT c.partition_id, c.consumer_group FROM consumers c
	WHERE c.lease_id = $1::uuid AND c.lease_expires_at > now()
	  AND ($3::text IS NULL OR c.lease_subject IS NULL OR c.lease_subject = $3)
	ORDER BY c.partition_id, c.consumer_group
	FOR NO KEY UPDATE OF c
)
UPDATE consumers c SET lease_expires_at = now() + make_interval(secs => coalesce($2::int, q.lease_time))
FROM lk, queues q
WHERE c.partition_id = lk.partition_id AND c.consumer_group = lk.consumer_group AND q.id = c.queue_id
RETURNING c.lease_expires_at`

// ExtendResult reports a lease extension.
type ExtendResult struct {
	LeaseID   string
	Success   bool
	Error     string
	ExpiresAt time.Time // zero when not extended
}

// ExtendLease pushes the expiry of every (partition, group) lease held under
// leaseID to now + seconds; 0 means each queue's lease time. seconds outside
// 0..MaxLeaseSeconds is an input error and changes nothing. A holder other
// than "" may extend only a lease leased to it (or to no subject), as
// Ack.Holder.
func (s *Store) ExtendLease(ctx context.Context, leaseID string, seconds int, holder string) (*ExtendResult, error) {
	if seconds < 0 || seconds > MaxLeaseSeconds {
		return nil, inputErrorf("seconds must be an integer between 0 and %d (a day)", MaxLeaseSeconds)
	}
	res := &ExtendResult{LeaseID: leaseID}
	if !ValidUUID(leaseID) {
		res.Error = ErrTextLeaseNotFound
		return res, nil
	}
	var secs *int32
	if seconds > 0 {
		v := int32(seconds) // bounded above
		secs = &v
	}
	err := s.pool.QueryRow(ctx, extendLeaseSQL, leaseID, secs, optString(holder)).Scan(&res.ExpiresAt)
	// Several rows share one lease id after a multi-partition pop; RETURNING
	// then yields one per row and QueryRow reads the first, which is enough.
	if err == nil {
		res.Success = true
		return res, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("extending lease %s: %w", leaseID, err)
	}
	var exists, foreign bool
	if err := s.pool.QueryRow(ctx, `SELECT count(*) > 0, coalesce(bool_or(lease_subject <> $2), false)
		FROM consumers WHERE lease_id = $1::uuid`, leaseID, holder).Scan(&exists, &foreign); err != nil {
		return nil, fmt.Errorf("checking lease %s: %w", leaseID, err)
	}
	switch {
	case exists && holder != "" && foreign:
		res.Error = ErrTextLeaseForeign
	case exists:
		res.Error = ErrTextLeaseExpired
	default:
		res.Error = ErrTextLeaseNotFound
	}
	return res, nil
}
