package queue_test

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/queue"
)

// An instance's members row, written every beat and read by every other
// instance, holds the follow streams of at most MemberFollowersMax queues,
// the most followed, however many queues its clients follow (names of up
// to 255 bytes each).
func TestMembers_FollowersRowKeepsTheMostFollowedQueues(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	many := map[string]int{"top": 7}
	for i := range queue.MemberFollowersMax + 50 {
		many[fmt.Sprintf("q%05d", i)] = 1
	}
	_, err := s.BeatMember(ctx, queue.Member{ID: "a", Session: "sa", StartedAt: time.Now(), Followers: many}, queue.MemberRead{})
	require.NoError(t, err)
	b, err := s.BeatMember(ctx, queue.Member{ID: "b", Session: "sb", StartedAt: time.Now()}, queue.MemberRead{})
	require.NoError(t, err)
	others := b.Members
	require.Len(t, others, 1)
	assert.Equal(t, queue.MemberFollowersMax, len(others[0].Followers), "at most MemberFollowersMax queues")
	assert.Equal(t, 7, others[0].Followers["top"], "the most followed kept")
	assert.Equal(t, queue.MemberFollowersMax+51, len(many), "the caller's map left alone")
}

// A beat sends its statement with no liveness ping before it: pgxpool pings
// a connection idle over a second before handing it out, and an idle
// instance's pool connections are idle that long at every beat, so each
// beat was two round trips. A beat that meets a dead connection (the
// database restarted) is sent again at once, where the pool pings.
func TestBeatMember_SendsNoPingFirstAndIsSentAgainAfterADeadConnection(t *testing.T) {
	ctx := ctxT(t)
	var pings atomic.Int64
	s, pool := storeOnOneConnection(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
			return pgproto3.NewFrontend(r, pingCounter{w, &pings})
		}
	})
	me := queue.Member{ID: "a", Session: "sa", StartedAt: time.Now()}
	_, err := s.BeatMember(ctx, me, queue.MemberRead{})
	require.NoError(t, err)
	var pid int
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	admin, err := pgx.Connect(ctx, pgtest.DSN(t))
	require.NoError(t, err)
	defer func() { _ = admin.Close(ctx) }()
	// The backend says when the pool's one connection last ran a statement:
	// idle past pgxpool's ping threshold (1 s) with margin, the pool would
	// ping it before handing it out.
	require.Eventually(t, func() bool {
		var idle bool
		return admin.QueryRow(ctx, "SELECT now() - state_change > interval '1.2 s' FROM pg_stat_activity WHERE pid = $1",
			pid).Scan(&idle) == nil && idle
	}, 10*time.Second, 50*time.Millisecond)
	before := pings.Load()
	_, err = s.BeatMember(ctx, me, queue.MemberRead{})
	require.NoError(t, err)
	assert.Zero(t, pings.Load()-before, "pings sent before the beat")

	var ended bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&ended))
	require.True(t, ended)
	_, err = s.BeatMember(ctx, me, queue.MemberRead{})
	require.NoError(t, err, "a beat on a dead connection is sent again on a live one")
}

// pingCounter counts the liveness pings (pgconn's "-- ping" simple query)
// written through it.
type pingCounter struct {
	w io.Writer
	n *atomic.Int64
}

func (c pingCounter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("-- ping")) {
		c.n.Add(1)
	}
	return c.w.Write(p)
}

// A beat commits without waiting for its WAL to be flushed (its row is
// rewritten every beat, and a beat lost in a crash is the one before it,
// a beat older), where the session's synchronous_commit is on: the flush
// was a quarter of the database's work for a beat. Seen as WAL writes: a
// synchronous commit writes its WAL itself, an asynchronous one leaves it
// to the WAL writer (every 200 ms).
func TestBeatMember_CommitsWithoutWaitingForItsWAL(t *testing.T) {
	ctx := ctxT(t)
	s, pool := storeOnOneConnection(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on" })
	walWrites := func() (n int64) {
		t.Helper()
		_, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()") // this backend's counts, flushed as it ends
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, "SELECT wal_write FROM pg_stat_wal").Scan(&n))
		return n
	}
	me := queue.Member{ID: "a", Session: "sa", StartedAt: time.Now()}
	_, err := s.BeatMember(ctx, me, queue.MemberRead{})
	require.NoError(t, err)
	const beats = 20
	before := walWrites()
	for range beats {
		_, err := s.BeatMember(ctx, me, queue.MemberRead{})
		require.NoError(t, err)
	}
	assert.Less(t, walWrites()-before, int64(beats/2), "WAL writes for %d beats", beats)
}

// A beat reads only the rows changed since the time it names (in what the
// others read of them: address, session, start, listens, digest,
// followers) and those gone quiet, with the count of every other row: an
// idle mesh's beats read no row, where each read every other one (O(N) a
// beat, O(N²) for the mesh).
func TestBeatMember_ReadsOnlyRowsChangedSinceAndRowsGoneQuiet(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	dead := 2 * time.Second
	a := queue.Member{ID: "a", Session: "sa", StartedAt: time.Now()}
	b := queue.Member{ID: "b", Session: "sb", StartedAt: time.Now(), SyncAddr: "127.0.0.1:9"}
	c := queue.Member{ID: "c", Session: "sc", StartedAt: time.Now()}
	beat := func(m queue.Member, since time.Time) queue.MemberBeat {
		t.Helper()
		got, err := s.BeatMember(ctx, m, queue.MemberRead{Since: since, DeadAfter: dead})
		require.NoError(t, err)
		return got
	}
	ids := func(b queue.MemberBeat) (out []string) {
		for _, m := range b.Members {
			out = append(out, m.ID)
		}
		return out
	}
	beat(b, time.Time{})
	beat(c, time.Time{})
	all := beat(a, time.Time{})
	assert.Equal(t, []string{"b", "c"}, ids(all), "every other row without a since")
	assert.Equal(t, 2, all.Others)

	beat(b, time.Time{}) // written again, unchanged
	beat(c, time.Time{})
	none := beat(a, all.At)
	assert.Empty(t, ids(none), "rows written again unchanged are not read")
	assert.Equal(t, 2, none.Others, "the count still covers them")

	b.Digest = 42
	beat(b, time.Time{})
	changed := beat(a, none.At)
	assert.Equal(t, []string{"b"}, ids(changed), "a row whose digest changed is read")
	assert.Equal(t, uint64(42), changed.Members[0].Digest)

	// c goes quiet (b keeps beating): read at every beat once it is
	// DeadAfter old, with its age.
	var quiet queue.MemberBeat
	require.Eventually(t, func() bool {
		beat(b, time.Time{})
		quiet = beat(a, changed.At)
		return slices.Contains(ids(quiet), "c")
	}, 10*time.Second, 100*time.Millisecond)
	assert.Equal(t, []string{"c"}, ids(quiet))
	assert.Greater(t, quiet.Members[0].Age, dead)
	back := beat(c, time.Time{}) // written again after going quiet: changed
	assert.Equal(t, []string{"a", "b"}, ids(back))
	read := beat(a, quiet.At)
	require.Equal(t, []string{"c"}, ids(read), "a row written again after going quiet is read")
	assert.Less(t, read.Members[0].Age, dead)

	require.NoError(t, s.LeaveMember(ctx, "c", "sc"))
	assert.Equal(t, 1, beat(a, read.At).Others, "a row gone lowers the count")
}

// A beat reads the rows it names as held gone whatever their changed_at:
// a row seen quiet that is written again without its changed_at moving (an
// instance of the version before the column, one whose MemberDeadAfter is
// longer, a beat whose statement began before the row counted as quiet) is
// read at once, not at the next read of every row.
func TestBeatMember_ReadsTheRowsHeldGoneWhateverTheirChange(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	a := queue.Member{ID: "a", Session: "sa", StartedAt: time.Now()}
	b := queue.Member{ID: "b", Session: "sb", StartedAt: time.Now()}
	read := queue.MemberRead{DeadAfter: time.Minute}
	_, err := s.BeatMember(ctx, b, read)
	require.NoError(t, err)
	all, err := s.BeatMember(ctx, a, read)
	require.NoError(t, err)
	require.Len(t, all.Members, 1)

	read.Since = all.At
	none, err := s.BeatMember(ctx, a, read)
	require.NoError(t, err)
	assert.Empty(t, none.Members, "b unchanged since")
	read.Gone = []string{"b", "elsewhere"}
	named, err := s.BeatMember(ctx, a, read)
	require.NoError(t, err)
	require.Len(t, named.Members, 1, "b named as held gone")
	assert.Equal(t, "b", named.Members[0].ID)
	assert.Equal(t, 1, named.Others)
}

// A row written by an instance of the version before changed_at (a rolling
// upgrade's old instances, whose beat leaves the column as it was) still
// moves it when what the others read of it changes: its digest change is
// read at the next beat, not at the next read of every row (every 30 s),
// where a digest the reader holds stale makes it unreachable to syncnet.
func TestBeatMember_ReadsARowChangedByAnInstanceThatDoesNotWriteChangedAt(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	a := queue.Member{ID: "a", Session: "sa", StartedAt: time.Now()}
	read := queue.MemberRead{DeadAfter: time.Minute}
	// The write of the beat before changed_at (migration 0023), as is.
	started := time.Now()
	oldBeat := func(digest int64, followers string) {
		t.Helper()
		exec(t, s, `INSERT INTO members AS m (id, sync_addr, session, started_at, last_seen, listens, digest, followers)
			VALUES ('old', NULL, 'so', $1, now(), true, $2, $3::jsonb)
			ON CONFLICT (id) DO UPDATE SET sync_addr = excluded.sync_addr, session = excluded.session,
				started_at = excluded.started_at, last_seen = now(), listens = excluded.listens, digest = excluded.digest,
				followers = excluded.followers`, started, digest, followers)
	}
	oldBeat(1, `{}`)
	all, err := s.BeatMember(ctx, a, read)
	require.NoError(t, err)
	require.Len(t, all.Members, 1)

	read.Since = all.At
	oldBeat(1, `{}`)
	none, err := s.BeatMember(ctx, a, read)
	require.NoError(t, err)
	assert.Empty(t, none.Members, "written again unchanged: not read")

	read.Since = none.At
	oldBeat(2, `{}`)
	changed, err := s.BeatMember(ctx, a, read)
	require.NoError(t, err)
	require.Len(t, changed.Members, 1, "its digest changed")
	assert.Equal(t, uint64(2), changed.Members[0].Digest)

	read.Since = changed.At
	oldBeat(2, `{"q": 3}`)
	followed, err := s.BeatMember(ctx, a, read)
	require.NoError(t, err)
	require.Len(t, followed.Members, 1, "its followers changed")
	assert.Equal(t, map[string]int{"q": 3}, followed.Members[0].Followers)
}
