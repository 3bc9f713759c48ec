package queue

import (
	"context"
	"fmt"
)

// Reconciling an instance's leases with a database that may have lost what
// it committed. A failover to an asynchronous standby (or a restart that
// lost unflushed commits) leaves the database older than what it answered:
//
//   - an ack (or a release) that ended a lease, answered success, is gone:
//     the lease is back, owned by this instance, though no stream holds its
//     messages any more; the partition would wait the lease time and its
//     messages come back charged an attempt;
//   - a pop that leased and delivered is gone: a stream holds deliveries
//     under a lease the database does not have, and counts them against its
//     credit until its lease check (or a refused ack) finds out.
//
// ReconcileInstanceLeases settles both in one statement: it gives back
// every lease this instance's streams own that none holds (uncharged), and
// tells which of the held ones the database still has.

// reconcileInstanceSQL gives back the leases owned by $1 (the instance's
// streams') whose id is below $3 (made before the reconciliation began: a
// pop under way makes its lease above it) and not among $2 (the leases the
// streams hold), as freeOwnedLeasesSQL does, and names what it freed
// ('freed' rows); then names which of $2 are live ('live' rows). The snapshot of the live part is the statement's, from
// before its update, which never touches a lease of $2.
var reconcileInstanceSQL = freeOwnedLeasesSQL("reconcile_instance_leases",
	`c.lease_id < $3::uuid AND NOT (c.lease_id = ANY($2::uuid[]))`,
	`SELECT true, freed.* FROM freed
UNION ALL
SELECT DISTINCT false, '', '', c.lease_id::text, ''
FROM consumers c WHERE c.lease_id = ANY($2::uuid[]) AND c.lease_expires_at > now()`)

// Reconciled is what ReconcileInstanceLeases found.
type Reconciled struct {
	// Freed are the (partition, group) pairs whose lease no stream held,
	// given back.
	Freed []FreedLease
	// Live are the held leases the database has, unexpired; a held lease
	// missing from it is lost (or ended since).
	Live map[string]bool
}

// ReconcileInstanceLeases gives back at once, without counting an attempt,
// every lease recorded under this instance's id (its streams'; not the
// "#pop" leases its clients hold) that is not in held and whose id sorts
// below before (a NewID taken before held was read: lease ids are UUIDv7,
// increasing in this process, so a pop that was under way then or began
// after leased above it), and reports which of held the database has,
// live. Call it with the instance id's lock held (LockInstance), after the
// database changed under the instance (InstanceLock.OnDatabaseChanged).
func (s *Store) ReconcileInstanceLeases(ctx context.Context, held []string, before string) (*Reconciled, error) {
	ids := make([]string, 0, len(held))
	for _, id := range held {
		if ValidUUID(id) {
			ids = append(ids, id)
		}
	}
	if !ValidUUID(before) {
		return nil, fmt.Errorf("reconciling the leases of instance %s: %w", s.cfg.InstanceID,
			inputErrorf("the bound %q is not a lease id", before))
	}
	rows, err := s.pool.Query(ctx, reconcileInstanceSQL, s.cfg.InstanceID, ids, before)
	if err != nil {
		return nil, fmt.Errorf("reconciling the leases of instance %s: %w", s.cfg.InstanceID, err)
	}
	defer rows.Close()
	out := &Reconciled{Live: map[string]bool{}}
	for rows.Next() {
		var freed bool
		var l FreedLease
		if err := rows.Scan(&freed, &l.Queue, &l.Partition, &l.PartitionID, &l.Group); err != nil {
			return nil, fmt.Errorf("reconciling the leases of instance %s: %w", s.cfg.InstanceID, err)
		}
		if freed {
			out.Freed = append(out.Freed, l)
		} else {
			out.Live[l.PartitionID] = true // the lease id, in that column
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reconciling the leases of instance %s: %w", s.cfg.InstanceID, err)
	}
	return out, nil
}
