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
	err := s.pool.QueryRow(ctx, `-- herald:extend_lease
		UPDATE consumers c SET lease_expires_at = now() + make_interval(secs => coalesce($2::int, q.lease_time))
		FROM partitions p JOIN queues q ON q.id = p.queue_id
		WHERE c.lease_id = $1::uuid AND p.id = c.partition_id AND c.lease_expires_at > now()
		  AND ($3::text IS NULL OR c.lease_subject IS NULL OR c.lease_subject = $3)
		RETURNING c.lease_expires_at`, leaseID, secs, optString(holder)).Scan(&res.ExpiresAt)
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
