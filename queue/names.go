package queue

import (
	"context"
	"fmt"
	"strings"
)

// PartitionName is a partition as a token's rights name it.
type PartitionName struct{ Queue, Partition string }

// PartitionNames returns the queue and name of each partition id that
// exists (an id never changes its names: answers are cached). Ids that are
// not UUIDs or name no partition are absent.
func (s *Store) PartitionNames(ctx context.Context, ids []string) (map[string]PartitionName, error) {
	return s.VisiblePartitions(ctx, ids, nil)
}

// VisiblePartitions is PartitionNames for a caller who may see only the
// partitions allow accepts (nil: all). It is keyed by the ids in lower
// case (PostgreSQL's spelling; an id is read in any case). A partition
// allow refuses is left out as an id of no partition is, and costs what
// that costs: an id the cache knows but allow refuses is read from the
// database again, as an unknown one is, so that neither the answer nor its
// time tells another's partition from one that does not exist.
func (s *Store) VisiblePartitions(ctx context.Context, ids []string, allow func(PartitionName) bool) (map[string]PartitionName, error) {
	out := make(map[string]PartitionName, len(ids))
	var missing []string
	for _, id := range ids {
		if !ValidUUID(id) {
			continue
		}
		id = strings.ToLower(id)
		if n, ok := s.partitionNames.Get(id); ok && (allow == nil || allow(n)) {
			out[id] = n
		} else {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, `-- herald:partition_names
SELECT p.id::text, q.id::text, q.name, p.name FROM partitions p JOIN queues q ON q.id = p.queue_id WHERE p.id = ANY($1::uuid[])`, missing)
	if err != nil {
		return nil, fmt.Errorf("reading partition names: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, queueID string
		var n PartitionName
		if err := rows.Scan(&id, &queueID, &n.Queue, &n.Partition); err != nil {
			return nil, fmt.Errorf("reading partition names: %w", err)
		}
		s.notePartition(partKey{n.Queue, n.Partition}, partRef{queueID: queueID, partitionID: id})
		if allow == nil || allow(n) {
			out[id] = n
		}
	}
	return out, rows.Err()
}

// LeasePartitions returns, for each of leaseIDs (read in any case, keyed
// in lower case) that some consumer row holds, the names of the
// partitions it holds, in one round trip for all of them: what a rights
// check needs, whether the lease is anyone's or nobody's. Ids that are not
// UUIDs are absent.
func (s *Store) LeasePartitions(ctx context.Context, leaseIDs []string) (map[string][]PartitionName, error) {
	var ids []string
	for _, id := range leaseIDs {
		if ValidUUID(id) {
			ids = append(ids, strings.ToLower(id))
		}
	}
	out := map[string][]PartitionName{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, `-- herald:lease_partitions
SELECT DISTINCT c.lease_id::text, q.name, p.name FROM consumers c JOIN partitions p ON p.id = c.partition_id
JOIN queues q ON q.id = p.queue_id WHERE c.lease_id = ANY($1::uuid[])`, ids)
	if err != nil {
		return nil, fmt.Errorf("reading leases' partitions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var n PartitionName
		if err := rows.Scan(&id, &n.Queue, &n.Partition); err != nil {
			return nil, fmt.Errorf("reading leases' partitions: %w", err)
		}
		out[id] = append(out[id], n)
	}
	return out, rows.Err()
}
