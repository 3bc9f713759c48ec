package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// What a logical-replication wake source needs of the schema (pgnotify's
// Logical, through its Tables interface): the publication its stream
// reads, and the names of an inserted message's partition. The stream
// itself, and everything about replication, stays in pgnotify; the tables
// it reads are described here with every other statement on them.

// MessagePublication creates, if it does not exist, the publication of the
// inserts into the messages table of the pool's schema (one per schema:
// herald_<schema>, shared by every instance), and returns its name. Only
// inserts are published: an insert is what can wake a consumer, and
// updates or deletes would cost WAL decoding for nothing.
func (s *Store) MessagePublication(ctx context.Context) (string, error) {
	var schema string
	var exists bool
	err := s.pool.QueryRow(ctx, `-- herald:message_publication
		SELECT current_schema(), EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'herald_' || current_schema())`).
		Scan(&schema, &exists)
	if err != nil {
		return "", fmt.Errorf("looking up the message publication: %w", err)
	}
	name := "herald_" + schema
	if exists {
		return name, nil
	}
	_, err = s.pool.Exec(ctx, `CREATE PUBLICATION `+pgx.Identifier{name}.Sanitize()+` FOR TABLE `+
		pgx.Identifier{schema, "messages"}.Sanitize()+` WITH (publish = 'insert')`)
	var pgErr *pgconn.PgError
	// Another instance created it meanwhile: duplicate_object when its
	// creation committed before this one looked, unique_violation on the
	// catalog when both were creating at once.
	if errors.As(err, &pgErr) && (pgErr.Code == "42710" || pgErr.Code == "23505") {
		return name, nil
	}
	if err != nil {
		return "", fmt.Errorf("creating publication %s: %w", name, err)
	}
	return name, nil
}

// PartitionOf returns the queue and name of a partition id, as
// PartitionNames does for many (cached: an id never changes its names).
// It fails with ErrNotFound when no partition has the id.
func (s *Store) PartitionOf(ctx context.Context, partitionID string) (queue, partition string, err error) {
	if n, ok := s.partitionNames.Get(partitionID); ok {
		return n.Queue, n.Partition, nil
	}
	names, err := s.PartitionNames(ctx, []string{partitionID})
	if err != nil {
		return "", "", err
	}
	n, ok := names[strings.ToLower(partitionID)]
	if !ok {
		return "", "", fmt.Errorf("reading partition %s: %w", partitionID, ErrNotFound)
	}
	return n.Queue, n.Partition, nil
}
