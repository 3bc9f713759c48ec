package queue

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Writing consumer rows back, after a pop, an ack or any other change of
// their cursorState.

// consumerUpdateSQL writes changed consumer rows back. A NULL ltime keeps
// the expiry (and owner and subject) of the lease the row already has.
const consumerUpdateSQL = `-- herald:consumer_update
UPDATE consumers c SET cursor = u.cur, done = u.done::bigint[], attempts = u.att, attempt_seq = u.aseq,
	lease_id = u.lease::uuid,
	lease_owner = CASE WHEN u.lease IS NULL THEN NULL ELSE coalesce(u.owner, c.lease_owner) END,
	lease_subject = CASE WHEN u.ltime IS NULL OR u.lease IS NULL THEN c.lease_subject ELSE u.subj END,
	lease_expires_at = CASE WHEN u.lease IS NULL THEN NULL
		WHEN u.ltime IS NULL THEN c.lease_expires_at ELSE now() + make_interval(secs => u.ltime) END,
	lease_from = CASE WHEN u.lease IS NULL THEN NULL ELSE u.lfrom END,
	lease_to = CASE WHEN u.lease IS NULL THEN NULL ELSE u.lto END,
	delivered_to = greatest(c.delivered_to, CASE WHEN u.lease IS NULL THEN 0 ELSE u.lto END),
	leased_at = CASE WHEN u.ltime IS NULL THEN c.leased_at ELSE now() END,
	-- A lease's end is a lower bound of its partition's last offset: a
	-- following lease's (read from the partition) keeps the copy up to date.
	last_offset = greatest(c.last_offset, CASE WHEN u.lease IS NULL THEN 0 ELSE u.lto END)
FROM unnest($1::text[], $2::bigint[], $3::text[], $4::int[], $5::bigint[], $6::text[], $7::int[],
            $8::bigint[], $9::bigint[], $10::text[], $11::text[], $12::text[])
     AS u(pid, cur, done, att, aseq, lease, ltime, lfrom, lto, grp, owner, subj)
WHERE c.partition_id = u.pid::uuid AND c.consumer_group = u.grp`

// consumerUpdates batches consumer rows to write with consumerUpdateSQL.
type consumerUpdates struct {
	pid, done, lease, grp, owner, subj []*string
	cur, aseq, lfrom, lto              []int64
	att                                []int32
	ltime                              []*int32
}

// add queues a row. leaseTime ≥ 0 starts a new lease of that many seconds,
// held by owner for subject; -1 keeps the expiry of an existing lease.
func (u *consumerUpdates) add(partitionID, group string, st *cursorState, leaseTime int, owner, subject string) {
	u.pid = append(u.pid, &partitionID)
	u.grp = append(u.grp, &group)
	u.cur = append(u.cur, st.cursor)
	d := st.doneLiteral()
	u.done = append(u.done, &d)
	u.att = append(u.att, int32(st.attempts))
	u.aseq = append(u.aseq, st.attemptSeq)
	u.lease = append(u.lease, optString(st.leaseID))
	u.lfrom = append(u.lfrom, st.leaseFrom)
	u.lto = append(u.lto, st.leaseTo)
	if leaseTime >= 0 {
		lt := int32(leaseTime)
		u.ltime = append(u.ltime, &lt)
		u.owner = append(u.owner, &owner)
		u.subj = append(u.subj, optString(subject))
	} else {
		u.ltime = append(u.ltime, nil)
		u.owner = append(u.owner, nil)
		u.subj = append(u.subj, nil)
	}
}

func (u *consumerUpdates) exec(ctx context.Context, q querier) error {
	if len(u.pid) == 0 {
		return nil
	}
	_, err := q.Exec(ctx, consumerUpdateSQL,
		u.pid, u.cur, u.done, u.att, u.aseq, u.lease, u.ltime, u.lfrom, u.lto, u.grp, u.owner, u.subj)
	if err != nil {
		return fmt.Errorf("updating consumers: %w", err)
	}
	return nil
}

// queue adds the update to b instead of running it.
func (u *consumerUpdates) queue(b *pgx.Batch) {
	if len(u.pid) == 0 {
		return
	}
	b.Queue(consumerUpdateSQL, u.pid, u.cur, u.done, u.att, u.aseq, u.lease, u.ltime, u.lfrom, u.lto, u.grp, u.owner, u.subj)
}
