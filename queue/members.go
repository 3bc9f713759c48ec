package queue

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Member is one instance's row in the members table.
type Member struct {
	ID        string // its syncnet server id, or its instance name
	SyncAddr  string // host:port of its syncnet socket; empty without syncnet
	Session   string // changes when it restarts
	StartedAt time.Time
	Listens   bool   // it wakes by NOTIFY
	Digest    uint64 // its syncnet presence digest
	// Followers are its follow streams per queue, as of its last beat (of
	// its MemberFollowersMax most followed queues).
	Followers map[string]int
	// Age is how long ago it last wrote its row (the database's clock), as
	// of the read that returned it.
	Age time.Duration
}

// MemberFollowersMax bounds the queues whose follow streams a members row
// holds (Member.Followers): the most followed, so that a beat, read by
// every other instance every 2 s, stays small however many queues are
// followed (a few hundred KB at most with 255-byte names).
const MemberFollowersMax = 1000

// MemberPurgeAfter: rows not written for this long are deleted (an
// instance that died without deleting its own).
const MemberPurgeAfter = time.Minute

// memberBeatSQL writes this instance's row, deletes rows long dead, and
// reads the other rows changed since $9 (all of them when $9 is NULL),
// those not written for $10 seconds, those $11 names (the reader holds
// them gone), how many others there are and when a maintenance switch
// last changed, in one round trip (one row with no member when none is
// read). A row's changed_at moves when what the others read of it
// changes, or when it is written after going quiet, so that an idle mesh
// reads nothing but the count (for a writer of a version before the
// column, a trigger moves it on a change: migration 0024). last_seen,
// changed_at and the ages are the database's clock: instances' clocks
// need not agree.
// It commits without waiting for its WAL to reach disk (async): the row is
// written again next beat, and a crash loses at most the last one, which
// leaves it a beat older (the WAL flush was a quarter of the beat's
// database CPU).
const memberBeatSQL = `-- herald:member_beat
WITH async AS (
	SELECT set_config('synchronous_commit', 'off', true)
), me AS (
	INSERT INTO members AS m (id, sync_addr, session, started_at, last_seen, listens, digest, followers, changed_at)
	VALUES ($1, nullif($2, ''), $3, $4, now(), $5, $6, $8::jsonb, now())
	ON CONFLICT (id) DO UPDATE SET sync_addr = excluded.sync_addr, session = excluded.session,
		started_at = excluded.started_at, last_seen = now(), listens = excluded.listens, digest = excluded.digest,
		followers = excluded.followers,
		changed_at = CASE WHEN m.last_seen < now() - make_interval(secs => $10)
		                    OR (m.sync_addr, m.session, m.started_at, m.listens, m.digest, m.followers) IS DISTINCT FROM
		                       (excluded.sync_addr, excluded.session, excluded.started_at, excluded.listens, excluded.digest, excluded.followers)
		                  THEN now() ELSE m.changed_at END
), purged AS (
	DELETE FROM members WHERE id <> $1 AND last_seen < now() - make_interval(secs => $7)
)
SELECT m.id, coalesce(m.sync_addr, ''), m.session, m.started_at, m.listens, m.digest,
       extract(epoch FROM now() - m.last_seen)::float8, s.at, m.followers::text, o.n, now()
FROM (SELECT max(updated_at) AS at FROM system_state WHERE key IN ('maintenance_mode', 'pop_maintenance_mode')) s
CROSS JOIN async
CROSS JOIN (SELECT count(*)::int AS n FROM members WHERE id <> $1) o
LEFT JOIN members m ON m.id <> $1
	AND ($9::timestamptz IS NULL OR m.changed_at > $9 OR m.last_seen < now() - make_interval(secs => $10)
		OR m.id = ANY($11::text[]))
ORDER BY m.id`

// MemberRead is what a beat reads of the other rows: every one (Since
// zero), or those changed after Since, those not written for DeadAfter
// and those Gone names: the rows the reader holds as gone (read as quiet),
// read whatever their changed_at, so that one written again is alive
// again at once even when its write did not move changed_at (an instance
// of the version before the column, one whose own DeadAfter is longer, a
// beat whose statement began before the row counted as quiet).
type MemberRead struct {
	Since     time.Time
	DeadAfter time.Duration
	Gone      []string
}

// MemberBeat is what a beat read.
type MemberBeat struct {
	Members []Member  // the other rows read, with their age
	Others  int       // the other rows in the table (read or not)
	At      time.Time // the database's time of the read
	StateAt time.Time // when a maintenance switch last changed (zero: never)
}

// BeatMember writes self's row (last_seen now) and reads the other members
// as read asks, with their age, and when a maintenance switch last changed:
// the beat is how an instance that neither LISTENs nor heard a datagram
// learns of a switch within a beat, and it costs no statement of its own.
//
// The beat goes out with no liveness ping before it (withoutPing): an idle
// instance's connections are idle past the pool's ping threshold at every
// beat, and the ping was half of what the beat cost. It is idempotent, so
// a beat that failed (a connection the database ended) is sent again at
// once, on a connection the pool pings.
func (s *Store) BeatMember(ctx context.Context, self Member, read MemberRead) (MemberBeat, error) {
	followers := followersJSON(self)
	b, err := beatMember(withoutPing(ctx), s.pool, self, followers, read)
	if err != nil && ctx.Err() == nil {
		b, err = beatMember(ctx, s.pool, self, followers, read)
	}
	return b, err
}

// BeatMemberOn is BeatMember on conn, once: a connection the instance
// keeps open anyway (its LISTEN connection), which the beat then proves
// alive. Its caller sends the beat through BeatMember when it fails.
func (s *Store) BeatMemberOn(ctx context.Context, conn *pgx.Conn, self Member, read MemberRead) (MemberBeat, error) {
	return beatMember(ctx, conn, self, followersJSON(self), read)
}

// followersJSON is self's Followers as the beat writes them.
func followersJSON(self Member) []byte {
	followers, err := json.Marshal(mostFollowed(self.Followers))
	if err != nil || self.Followers == nil {
		return []byte("{}")
	}
	return followers
}

func beatMember(ctx context.Context, db querier, self Member, followers []byte, read MemberRead) (MemberBeat, error) {
	var since *time.Time
	if !read.Since.IsZero() {
		since = &read.Since
	}
	rows, err := db.Query(ctx, memberBeatSQL, self.ID, self.SyncAddr, self.Session, self.StartedAt, self.Listens,
		int64(self.Digest), MemberPurgeAfter.Seconds(), string(followers), since, // #nosec G115 -- a hash, stored as its bits
		read.DeadAfter.Seconds(), read.Gone)
	if err != nil {
		return MemberBeat{}, fmt.Errorf("writing the member row: %w", err)
	}
	defer rows.Close()
	var b MemberBeat
	for rows.Next() {
		var id, addr, session *string
		var started, at *time.Time
		var listens *bool
		var digest *int64
		var age *float64
		var follows *string
		if err := rows.Scan(&id, &addr, &session, &started, &listens, &digest, &age, &at, &follows, &b.Others, &b.At); err != nil {
			return MemberBeat{}, fmt.Errorf("reading members: %w", err)
		}
		if at != nil {
			b.StateAt = *at
		}
		if id == nil {
			continue // no other member read
		}
		m := Member{ID: *id, SyncAddr: *addr, Session: *session, StartedAt: *started, Listens: *listens}
		m.Digest, m.Age = uint64(*digest), time.Duration(*age*float64(time.Second)) // #nosec G115 -- the bits back
		if follows != nil {
			_ = json.Unmarshal([]byte(*follows), &m.Followers) // written by an instance: a bad one counts none
		}
		b.Members = append(b.Members, m)
	}
	if err := rows.Err(); err != nil {
		return MemberBeat{}, fmt.Errorf("reading members: %w", err)
	}
	return b, nil
}

// mostFollowed is f, or its MemberFollowersMax most followed queues when it
// holds more (ties by name).
func mostFollowed(f map[string]int) map[string]int {
	if len(f) <= MemberFollowersMax {
		return f
	}
	qs := slices.SortedFunc(maps.Keys(f), func(a, b string) int {
		return cmp.Or(cmp.Compare(f[b], f[a]), strings.Compare(a, b))
	})
	out := make(map[string]int, MemberFollowersMax)
	for _, q := range qs[:MemberFollowersMax] {
		out[q] = f[q]
	}
	return out
}

// LeaveMember deletes self's row (this session's only: a restarted
// instance under the same id keeps its own).
func (s *Store) LeaveMember(ctx context.Context, id, session string) error {
	if _, err := s.pool.Exec(ctx, `-- herald:member_leave
		DELETE FROM members WHERE id = $1 AND session = $2`, id, session); err != nil {
		return fmt.Errorf("deleting the member row: %w", err)
	}
	return nil
}
