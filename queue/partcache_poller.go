package queue

// The poller's view of the store's partition-id cache (Store.parts), the
// one cache of partition ids in an instance: a push hint names a partition
// by (queue, name), and the poller leases it by id without a pre-flight
// when the id is known. Pushes through this store fill the cache
// (resolvePartitions); the poller notes what its pre-flights read, so
// wake-ups from other instances' pushes find ids too. A miss, an expired or
// an evicted entry only costs the poller a pre-flight; a stale id (a
// partition deleted meanwhile) leases nothing, because the pop re-checks
// every partition under its row locks.

// CachedPartitionID returns the id of a queue's partition if the cache
// holds it. It sends no query.
func (s *Store) CachedPartitionID(queue, partition string) (string, bool) {
	ref, ok := s.parts.Get(partKey{queue, partition})
	if !ok {
		return "", false
	}
	return ref.partitionID, true
}

// NotePartitionID records a partition id and its queue's id read from the
// database (a pre-flight's row); an entry already there for the same ids is
// left as it is.
func (s *Store) NotePartitionID(queue, partition, queueID, partitionID string) {
	k := partKey{queue, partition}
	if ref, ok := s.parts.Peek(k); ok && ref.partitionID == partitionID && ref.queueID == queueID {
		return
	}
	s.notePartition(k, partRef{queueID: queueID, partitionID: partitionID})
}

// notePartition adds a partition to both indexes of the partition cache.
func (s *Store) notePartition(k partKey, ref partRef) {
	if s.parts.Add(k, ref) {
		s.partEvictions.Add(1)
	}
	s.partitionNames.Add(ref.partitionID, PartitionName{Queue: k.queue, Partition: k.partition})
}
