package queue

import (
	"context"
	"fmt"
)

// PartitionName is a partition as a token's rights name it.
type PartitionName struct{ Queue, Partition string }

// PartitionNames returns the queue and name of each partition id that
// exists (an id never changes its names: answers are cached). Ids that are
// not UUIDs or name no partition are absent.
func (s *Store) PartitionNames(ctx context.Context, ids []string) (map[string]PartitionName, error) {
	out := make(map[string]PartitionName, len(ids))
	var missing []string
	for _, id := range ids {
		if n, ok := s.partitionNames.Get(id); ok {
			out[id] = n
		} else if ValidUUID(id) {
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
		out[id] = n
	}
	return out, rows.Err()
}

// LeasePartitions returns the partitions a live lease holds (none when the
// id is not a UUID or holds nothing).
func (s *Store) LeasePartitions(ctx context.Context, leaseID string) ([]string, error) {
	if !ValidUUID(leaseID) {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `-- herald:lease_partitions
SELECT DISTINCT partition_id::text FROM consumers WHERE lease_id = $1::uuid`, leaseID)
	if err != nil {
		return nil, fmt.Errorf("reading a lease's partitions: %w", err)
	}
	return readIDs(rows)
}
