package queue

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Follow streams read a queue, or one partition of it, in one total order
// with no consumer group, lease or ack: nothing is written per follower.
// A message's position is (follow_xid, partition id, offset); see migration
// 0015 for why that order is total, respects each partition's offsets, and
// can only grow at its end (rows are read only below the reading snapshot's
// xmin, the barrier).

// FollowPos is a position in a queue's follow order: everything at or below
// it has been read. The zero value is before every message.
type FollowPos struct {
	XID         uint64 // the follow_xid of the message, or the barrier of a start
	PartitionID string // the message's partition (a UUID); "" sorts before every partition
	Offset      int64  // the message's offset in its partition; 0 before the first
}

// Compare orders positions: -1, 0 or +1.
func (p FollowPos) Compare(q FollowPos) int {
	if c := cmp.Compare(p.XID, q.XID); c != 0 {
		return c
	}
	if c := strings.Compare(p.pid(), q.pid()); c != 0 {
		return c
	}
	return cmp.Compare(p.Offset, q.Offset)
}

const nilUUID = "00000000-0000-0000-0000-000000000000"

// pid is the partition id as PostgreSQL compares it: uuids compare as
// bytes, which lowercase canonical text preserves.
func (p FollowPos) pid() string {
	if p.PartitionID == "" {
		return nilUUID
	}
	return p.PartitionID
}

// Follow event ids: "f1" then base64url (no padding) of a 4-byte tag of the
// queue's name (FNV-1a), uvarint XID, 16 bytes of partition id, uvarint
// offset. Opaque to clients; the version prefix lets a later format be told
// apart.
const followIDPrefix = "f1"

// errFollowPosition starts the input error (400) of a follow position
// that is malformed or belongs to another queue.
const errFollowPosition = "not a follow position of this queue"

// EncodeFollowID returns the event id of p in queue.
func EncodeFollowID(queue string, p FollowPos) string {
	b := make([]byte, 0, 4+binary.MaxVarintLen64*2+16)
	b = binary.BigEndian.AppendUint32(b, queueTag(queue))
	b = binary.AppendUvarint(b, p.XID)
	id, _ := hex.DecodeString(strings.ReplaceAll(p.pid(), "-", ""))
	if len(id) != 16 {
		id = make([]byte, 16)
	}
	b = append(b, id...)
	b = binary.AppendUvarint(b, uint64(max(p.Offset, 0)))
	return followIDPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// DecodeFollowID reads an event id of queue; it is
// an input error when it is malformed or names another queue.
func DecodeFollowID(queue, id string) (FollowPos, error) {
	bad := func(why string) (FollowPos, error) {
		return FollowPos{}, &InputError{Msg: errFollowPosition + ": " + why}
	}
	rest, ok := strings.CutPrefix(id, followIDPrefix)
	if !ok || len(id) > 80 {
		return bad("unknown format")
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || len(b) < 4 {
		return bad("unknown format")
	}
	if binary.BigEndian.Uint32(b) != queueTag(queue) {
		return bad("it is from another queue")
	}
	b = b[4:]
	xid, n := binary.Uvarint(b)
	if n <= 0 || len(b) < n+16 {
		return bad("truncated")
	}
	b = b[n:]
	pid := formatUUID([16]byte(b[:16]))
	b = b[16:]
	off, n := binary.Uvarint(b)
	if n <= 0 || n != len(b) || off > 1<<62 {
		return bad("truncated")
	}
	p := FollowPos{XID: xid, PartitionID: pid, Offset: int64(off)}
	if pid == nilUUID {
		p.PartitionID = ""
	}
	return p, nil
}

func queueTag(queue string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(queue))
	return h.Sum32()
}

// FollowFrom is where a follow starts when the client names no position.
type FollowFrom struct {
	Beginning bool      // every message still stored
	Time      time.Time // the first message stored at or after it (non-zero)
	// neither: now (what is pushed from here on)
}

// ParseFollowFrom reads a from= value: "now" or "" (now), "beginning", an
// RFC 3339 time, or an event id of queue (pos set).
func ParseFollowFrom(queue, v string) (from FollowFrom, pos *FollowPos, err error) {
	switch v {
	case "", "now":
		return FollowFrom{}, nil, nil
	case "beginning":
		return FollowFrom{Beginning: true}, nil, nil
	}
	if strings.HasPrefix(v, followIDPrefix) {
		p, err := DecodeFollowID(queue, v)
		if err != nil {
			return FollowFrom{}, nil, err
		}
		return FollowFrom{}, &p, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return FollowFrom{}, nil, inputErrorf("from must be now, beginning, an RFC 3339 time or an event id")
	}
	return FollowFrom{Time: t}, nil, nil
}

// FollowTarget is what a follower reads: a queue, or one of its partitions.
type FollowTarget struct {
	Queue     string
	Partition string // "" for the whole queue
}

// followStartSQL: the barrier now ($3 zero time: now), or the first
// message at or after $3 in follow order, for a queue ($2 empty) or a
// partition (then also the last offset below the barrier, which "now"
// means for a partition, and the partition's id).
const followStartSQL = `-- herald:follow_start
WITH q AS (SELECT id FROM queues WHERE name = $1),
part AS (SELECT p.id FROM partitions p WHERE p.queue_id = (SELECT id FROM q) AND p.name = $2 AND $2 <> ''),
bar AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS x)
SELECT (SELECT x FROM bar)::text,
	coalesce((SELECT id FROM part)::text, ''),
	-- a partition's last offset below the barrier (its follow_xid grows with the offset)
	coalesce((SELECT m.seq FROM messages m WHERE m.partition_id = (SELECT id FROM part)
	          AND m.follow_xid < (SELECT x FROM bar) ORDER BY m.seq DESC LIMIT 1), 0),
	-- the first message at or after $3 (when set): queue-wide, in follow order
	(SELECT m.follow_xid::text || ' ' || m.partition_id::text || ' ' || m.seq FROM messages m
	 WHERE $3::timestamptz > 'epoch' AND $2 = '' AND m.queue_id = (SELECT id FROM q) AND m.created_at >= $3::timestamptz
	 ORDER BY m.follow_xid, m.partition_id, m.seq LIMIT 1),
	-- or in the partition, by offset
	(SELECT m.seq FROM messages m
	 WHERE $3::timestamptz > 'epoch' AND m.partition_id = (SELECT id FROM part) AND m.created_at >= $3::timestamptz
	 ORDER BY m.seq LIMIT 1)`

// FollowStart returns the position a follower of t starts after when it
// names none: now (the barrier: what commits from here on comes next), the
// beginning, or just before the first message stored at or after a time.
// For a partition the position names the partition. A time past every
// message means now. From a time, the read walks the queue's messages in
// order up to it (bounded by retention).
func (s *Store) FollowStart(ctx context.Context, t FollowTarget, from FollowFrom) (FollowPos, error) {
	if err := ValidateName("queue", t.Queue); err != nil {
		return FollowPos{}, err
	}
	if t.Partition != "" {
		if err := ValidateName("partition", t.Partition); err != nil {
			return FollowPos{}, err
		}
	}
	if from.Beginning {
		return FollowPos{}, nil
	}
	at := time.Unix(0, 0).UTC()
	if !from.Time.IsZero() {
		at = from.Time
	}
	var bar, pid string
	var last int64
	var first *string
	var firstSeq *int64
	if err := s.pool.QueryRow(ctx, followStartSQL, t.Queue, t.Partition, at).Scan(&bar, &pid, &last, &first, &firstSeq); err != nil {
		return FollowPos{}, fmt.Errorf("starting a follow of %s: %w", t.Queue, err)
	}
	x, err := strconv.ParseUint(bar, 10, 64)
	if err != nil {
		return FollowPos{}, fmt.Errorf("starting a follow of %s: reading the barrier %q: %w", t.Queue, bar, err)
	}
	if t.Partition != "" {
		switch {
		case pid == "":
			// No such partition yet: everything it will hold is new.
			return FollowPos{}, nil
		case firstSeq != nil:
			return FollowPos{PartitionID: pid, Offset: *firstSeq - 1}, nil
		default:
			return FollowPos{PartitionID: pid, Offset: last}, nil
		}
	}
	if first != nil {
		f := strings.Fields(*first)
		if len(f) == 3 {
			fx, err1 := strconv.ParseUint(f[0], 10, 64)
			seq, err2 := strconv.ParseInt(f[2], 10, 64)
			if err1 == nil && err2 == nil {
				return FollowPos{XID: fx, PartitionID: f[1], Offset: seq - 1}, nil
			}
		}
	}
	return FollowPos{XID: x}, nil
}

// FollowMessage is one message read by a follower, with its position.
type FollowMessage struct {
	Pos FollowPos
	Message
}

// FollowBatch is one read of a follow.
type FollowBatch struct {
	// Messages after the position asked, in follow order, at most the
	// limit asked. Their Group and LeaseID are empty.
	Messages []FollowMessage
	// Gone, when set, is the highest position retention deleted, which is
	// above the position asked: messages after it were lost to this
	// follower (Messages are what is still stored after it).
	Gone *FollowPos
	// Held: messages committed after the position wait behind a
	// transaction still open (they are above the barrier): read again soon.
	Held bool
	// Full: the read reached the limit's count; there may be more now.
	Full bool
	// Barrier is the read's snapshot xmin: unless Full, the reader has
	// every message of its target below it (Covered).
	Barrier uint64
	// skipped: positions of messages that did not decrypt (Last moves
	// over them).
	skipped []FollowPos
}

// FollowLimitMax bounds one follow read.
const FollowLimitMax = 1000

// followReadSQL reads, for a queue ($2 empty) or a partition, up to $6
// messages after the position ($3, $4, $5) below the barrier; then the
// retention mark above the position, the barrier and whether messages
// wait above it. Rows: kind 0 a message, kind 1 the gone mark, kind 2 the
// barrier and the held flag (1); kind 3: the position names another partition than $2. A
// partition is read by offset (its follow order), through its
// primary key; a queue through messages_follow.
const followReadSQL = `-- herald:follow_read
WITH q AS (SELECT id FROM queues WHERE name = $1),
part AS (SELECT p.id FROM partitions p WHERE p.queue_id = (SELECT id FROM q) AND p.name = $2 AND $2 <> ''),
bar AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS x),
rows AS (
	(SELECT m.follow_xid, m.partition_id, m.seq, m.id, m.transaction_id, m.trace_id, m.producer_sub, m.payload, m.created_at
	 FROM messages m
	 WHERE $2 = '' AND m.queue_id = (SELECT id FROM q)
	   AND (m.follow_xid, m.partition_id, m.seq) > ($3::text::xid8, $4::uuid, $5::bigint)
	   AND m.follow_xid < (SELECT x FROM bar)
	 ORDER BY m.follow_xid, m.partition_id, m.seq LIMIT $6)
	UNION ALL
	(SELECT m.follow_xid, m.partition_id, m.seq, m.id, m.transaction_id, m.trace_id, m.producer_sub, m.payload, m.created_at
	 FROM messages m
	 WHERE $2 <> '' AND m.partition_id = (SELECT id FROM part) AND m.seq > $5::bigint
	   AND m.follow_xid < (SELECT x FROM bar)
	 ORDER BY m.seq LIMIT $6)
)
SELECT 0, r.follow_xid::text, r.partition_id::text, r.seq, r.id::text, r.transaction_id,
	coalesce(r.trace_id::text, ''), coalesce(r.producer_sub, ''), r.payload::text, r.created_at, p.name
FROM rows r JOIN partitions p ON p.id = r.partition_id
UNION ALL
SELECT 1, g.follow_xid::text, g.partition_id::text, g.seq, '', '', '', '', '', NULL, ''
FROM follow_gone g
WHERE ($2 = '' AND g.scope = (SELECT id FROM q) AND (g.follow_xid, g.partition_id, g.seq) > ($3::text::xid8, $4::uuid, $5::bigint))
   OR ($2 <> '' AND g.scope = (SELECT id FROM part) AND g.seq > $5::bigint)
UNION ALL
SELECT 2, (SELECT x FROM bar)::text, '', CASE WHEN
	($2 = '' AND EXISTS (SELECT 1 FROM messages m WHERE m.queue_id = (SELECT id FROM q) AND m.follow_xid >= (SELECT x FROM bar)))
	OR ($2 <> '' AND (SELECT m.follow_xid FROM messages m WHERE m.partition_id = (SELECT id FROM part)
	                  ORDER BY m.seq DESC LIMIT 1) >= (SELECT x FROM bar)) THEN 1 ELSE 0 END,
	'', '', '', '', '', NULL, ''
UNION ALL
SELECT 3, '', '', 0, '', '', '', '', '', NULL, ''
WHERE $2 <> '' AND $4::uuid <> '` + nilUUID + `' AND $4::uuid IS DISTINCT FROM (SELECT id FROM part)`

// ReadFollow reads up to limit messages of t after pos (bounded by
// FollowLimitMax), in follow order, in one statement. For a partition, pos
// must name that partition or none (a start position from FollowStart); a
// position of another partition is an input error.
func (s *Store) ReadFollow(ctx context.Context, t FollowTarget, pos FollowPos, limit int) (FollowBatch, error) {
	limit = min(max(limit, 1), FollowLimitMax)
	rows, err := s.pool.Query(ctx, followReadSQL, t.Queue, t.Partition,
		strconv.FormatUint(pos.XID, 10), pos.pid(), pos.Offset, limit)
	if err != nil {
		return FollowBatch{}, fmt.Errorf("reading a follow of %s: %w", t.Queue, err)
	}
	defer rows.Close()
	var out FollowBatch
	for rows.Next() {
		var kind int32
		var fx, pid, id, txid, trace, sub, payload, pname string
		var seq int64
		var created *time.Time
		if err := rows.Scan(&kind, &fx, &pid, &seq, &id, &txid, &trace, &sub, &payload, &created, &pname); err != nil {
			return FollowBatch{}, fmt.Errorf("reading a follow of %s: %w", t.Queue, err)
		}
		switch kind {
		case 2:
			out.Held = seq == 1
			if out.Barrier, err = strconv.ParseUint(fx, 10, 64); err != nil {
				return FollowBatch{}, fmt.Errorf("reading a follow of %s: barrier %q: %w", t.Queue, fx, err)
			}
			continue
		case 3:
			return FollowBatch{}, inputErrorf("%s: it is from another partition", errFollowPosition)
		}
		x, err := strconv.ParseUint(fx, 10, 64)
		if err != nil {
			return FollowBatch{}, fmt.Errorf("reading a follow of %s: position %q: %w", t.Queue, fx, err)
		}
		p := FollowPos{XID: x, PartitionID: pid, Offset: seq}
		if kind == 1 {
			out.Gone = &p
			continue
		}
		plain, ok := s.open(payload, sealRef{pid, txid, id})
		if !ok {
			// A follower cannot dead-letter it: it is skipped (and logged).
			s.log.Error().Str("queue", t.Queue).Str("partitionId", pid).Int64("offset", seq).
				Msg("a followed message does not decrypt: skipped")
			out.Messages = append(out.Messages, FollowMessage{Pos: p, Message: Message{Offset: -1}})
			continue
		}
		m := Message{ID: id, TransactionID: txid, TraceID: trace, Data: []byte(plain), ProducerSub: sub,
			PartitionID: pid, Partition: pname, Queue: t.Queue, Offset: seq}
		if created != nil {
			m.CreatedAt = *created
		}
		out.Messages = append(out.Messages, FollowMessage{Pos: p, Message: m})
	}
	if err := rows.Err(); err != nil {
		return FollowBatch{}, fmt.Errorf("reading a follow of %s: %w", t.Queue, err)
	}
	slices.SortFunc(out.Messages, func(a, b FollowMessage) int { return a.Pos.Compare(b.Pos) })
	out.Full = len(out.Messages) >= limit
	if t.Partition == "" && out.Gone != nil && out.Gone.XID >= out.Barrier {
		// Deleted above the barrier: a transaction still open may yet
		// place a message below the mark (at its own id, in another
		// partition), so a reader moved to the mark would skip it. The
		// gap is told once the barrier has passed the mark. (A partition
		// is read by offset: nothing comes below a deleted offset.)
		out.Gone = nil
	}
	// A message that did not decrypt keeps its place (the position moves
	// over it) but is not delivered.
	out.Messages = slices.DeleteFunc(out.Messages, func(m FollowMessage) bool {
		if m.Offset < 0 {
			out.skipped = append(out.skipped, m.Pos)
			return true
		}
		return false
	})
	return out, nil
}

// Covered is the position the reader has everything at or below after
// the batch: Last, or, when the read was not full, the barrier (no message
// of the target lies between the two, nor will one ever).
func (b FollowBatch) Covered(pos FollowPos) FollowPos {
	last := b.Last(pos)
	if bar := (FollowPos{XID: b.Barrier}); !b.Full && bar.Compare(last) > 0 {
		return bar
	}
	return last
}

// Last is the position the batch moves a follower to: its last message
// (skipped ones included), or pos when it read none.
func (b FollowBatch) Last(pos FollowPos) FollowPos {
	last := pos
	if n := len(b.Messages); n > 0 {
		last = b.Messages[n-1].Pos
	}
	for _, p := range b.skipped {
		if p.Compare(last) > 0 {
			last = p
		}
	}
	return last
}
