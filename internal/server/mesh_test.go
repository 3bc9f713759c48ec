package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/server"
	"github.com/heraldmq/herald/internal/server/servertest"
)

func memberIDs(in *servertest.Instance) []string {
	var ids []string
	for _, m := range in.Members() {
		ids = append(ids, m.ID)
	}
	return ids
}

// A new instance is known to the running ones within 5 s, with no list and
// no restart: a push on A wakes B's consumer over syncnet alone (no
// database wake source, a minute's sweep).
func TestMembership_NewInstanceIsKnownWithin5s(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a := servertest.Start(t, dsn, "syncnet")
	b := servertest.Start(t, dsn, "syncnet")
	start := time.Now()
	require.Eventually(t, func() bool {
		return a.Node().Known(b.Node().ServerID()) && b.Node().Known(a.Node().ServerID())
	}, 5*time.Second, 10*time.Millisecond, "each knows the other and its presence within 5 s")
	t.Logf("known to each other %v after B started", time.Since(start))
	servertest.ConsumeOnce(t, a, b, "found", 3)
}

// A stopped instance deletes its row: the others drop it at their next read.
func TestMembership_StoppedInstanceLeaves(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a := servertest.Start(t, dsn, "syncnet")
	b := servertest.Start(t, dsn, "syncnet")
	id := b.Node().ServerID()
	require.Eventually(t, func() bool { return slices.Contains(memberIDs(a), id) }, 5*time.Second, 10*time.Millisecond)
	b.Stop()
	start := time.Now()
	require.Eventually(t, func() bool { return !slices.Contains(memberIDs(a), id) && !a.Node().Known(id) },
		5*time.Second, 10*time.Millisecond, "gone at A's next read (2 s)")
	t.Logf("left %v after it stopped", time.Since(start))
}

// An instance that dies keeps its row, no longer written: it counts as gone
// once last-seen is MemberDeadAfter old, within 10 s.
func TestMembership_DeadInstanceLeaves(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a := servertest.Start(t, dsn, "syncnet")
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(context.Background(), `INSERT INTO members (id, sync_addr, session, started_at, listens)
		VALUES ('ghost:1', '127.0.0.1:9', 'g', now(), true)`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return slices.Contains(memberIDs(a), "ghost:1") }, 5*time.Second, 10*time.Millisecond)
	start := time.Now()
	require.Eventually(t, func() bool { return !slices.Contains(memberIDs(a), "ghost:1") }, 12*time.Second, 20*time.Millisecond,
		"dead within 10 s of its last write")
	t.Logf("dead %v after its last write", time.Since(start))
	assert.Less(t, time.Since(start), 10*time.Second)
}

// An instance seen dead (its row not written for MemberDeadAfter) that
// writes its row again is alive again at the others' next beat, also when
// that write leaves the row's changed_at as it was, which a read of the
// rows changed since does not return: a row an instance of the version
// before changed_at writes, one whose instance's MemberDeadAfter is longer
// (its row did not count as quiet to it), or a beat whose statement began
// before the row counted as quiet and committed after the read that saw it
// so. Not only at the next read of every row (every 30 s).
func TestMembership_InstanceSeenDeadIsAliveAgainAtTheNextBeatAfterItWritesItsRow(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a := servertest.Start(t, dsn, "none", func(c *server.Config) {
		c.MemberBeat, c.MemberDeadAfter = 100*time.Millisecond, time.Second
	})
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	// Its row last changed a minute ago: past the margin a read of the
	// changes since takes (the test is shorter than it).
	_, err = conn.Exec(context.Background(), `INSERT INTO members (id, sync_addr, session, started_at, listens, changed_at)
		VALUES ('ghost:1', '127.0.0.1:9', 'g', now(), true, now() - interval '1 minute')`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return slices.Contains(memberIDs(a), "ghost:1") }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return !slices.Contains(memberIDs(a), "ghost:1") }, 5*time.Second, 10*time.Millisecond,
		"dead once its row is a second old")
	// Its beat as the version before changed_at writes it.
	_, err = conn.Exec(context.Background(), `UPDATE members SET last_seen = now() WHERE id = 'ghost:1'`)
	require.NoError(t, err)
	start := time.Now()
	require.Eventually(t, func() bool { return slices.Contains(memberIDs(a), "ghost:1") }, 3*time.Second, 10*time.Millisecond,
		"alive again within a few beats")
	t.Logf("alive again %v after its write", time.Since(start))
}

// An instance that LISTENs beats on its LISTEN connection: one backend
// wakes for the beat and for the connection's liveness, which the beat
// proves (the connection needs no ping of its own while it beats).
func TestMembership_BeatsOnTheListeningConnection(t *testing.T) {
	ctx := context.Background()
	dsn := servertest.SharedDSN(t)
	a := servertest.Start(t, dsn, "notify", func(c *server.Config) { c.MemberBeat = 200 * time.Millisecond })
	var pid int32
	require.NoError(t, a.Listener().Do(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
	}))
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	require.Eventually(t, func() bool {
		var last string
		err := conn.QueryRow(ctx, `SELECT query FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&last)
		return err == nil && strings.HasPrefix(last, "-- herald:member_beat")
	}, 10*time.Second, 10*time.Millisecond, "the LISTEN connection's last statement is a beat")
}

// With every other instance that listens known over syncnet, a push sends
// no NOTIFY (syncnet woke the consumers); an instance without syncnet joins
// and pushes NOTIFY again, and it is woken.
func TestNotify_SkippedWhereSyncnetWokeEveryListener(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	notifying := func(c *server.Config) { c.Wake = server.WakeNotify }
	a := servertest.Start(t, dsn, "syncnet", notifying)
	b := servertest.Start(t, dsn, "syncnet", notifying)
	require.Eventually(t, func() bool { return a.Node().Known(b.Node().ServerID()) }, 5*time.Second, 10*time.Millisecond)
	servertest.ConsumeOnce(t, a, b, "quiet", 3)
	assert.Zero(t, a.Notifier().Sent(), "no NOTIFY: syncnet woke B")

	c := servertest.Start(t, dsn, "notify")
	require.Eventually(t, func() bool { return slices.Contains(memberIDs(a), c.Instance()) }, 5*time.Second, 10*time.Millisecond)
	servertest.ConsumeOnce(t, a, c, "loud", 2)
	assert.Positive(t, a.Notifier().Sent(), "C has no syncnet: NOTIFY wakes it")
}

// A maintenance switch that changes with no NOTIFY and no datagram to tell
// (an instance that polls, without syncnet) is seen at the next members
// beat, which reads when a switch last changed: not only at the periodic
// read of the switches (an hour here).
func TestMaintenance_SwitchSeenAtTheMembersBeat(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a := servertest.Start(t, dsn, "poll", func(c *server.Config) {
		c.Adjust.Gateway = func(g *gateway.Config) { g.MaintenanceRefresh = time.Hour }
	})
	require.False(t, a.Poller().Paused())
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	// As another instance's switch writes it, minus its NOTIFY.
	_, err = conn.Exec(context.Background(), `INSERT INTO system_state (key, value, updated_at, updated_by)
		VALUES ('pop_maintenance_mode', '{"enabled": true}', clock_timestamp(), 'elsewhere')
		ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at`)
	require.NoError(t, err)
	start := time.Now()
	require.Eventually(t, a.Poller().Paused, 10*time.Second, 20*time.Millisecond, "pop maintenance seen")
	t.Logf("seen %v after the switch", time.Since(start))
	_, err = conn.Exec(context.Background(), `UPDATE system_state SET value = '{"enabled": false}', updated_at = clock_timestamp()
		WHERE key = 'pop_maintenance_mode'`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !a.Poller().Paused() }, 10*time.Second, 20*time.Millisecond, "its end seen")
}

// followerCounts is an instance's status: its own followers of queue q and
// those of every instance alive.
func followerCounts(t *testing.T, in *servertest.Instance, q string) (here, all int) {
	t.Helper()
	code, body := in.Call(http.MethodGet, "/internal/api/status", "")
	require.Equal(t, http.StatusOK, code, body)
	var st struct {
		Followers        map[string]int `json:"followers"`
		ClusterFollowers map[string]int `json:"clusterFollowers"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &st))
	return st.Followers[q], st.ClusterFollowers[q]
}

// The console's follower counts are the cluster's: followers of a queue on
// one instance show in another's status (as of that instance's last beat
// in the members table), and leave it when they go.
func TestFollowers_StatusCountsEveryInstancesFollowers(t *testing.T) {
	dsn := servertest.SharedDSN(t)
	a := servertest.Start(t, dsn, "none", func(c *server.Config) { c.MemberBeat = 200 * time.Millisecond })
	b := servertest.Start(t, dsn, "none", func(c *server.Config) { c.MemberBeat = 200 * time.Millisecond })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.URL()+"/api/v1/follow/queue/fq", nil)
		require.NoError(t, err)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer func() { _ = res.Body.Close() }()
		require.Equal(t, http.StatusOK, res.StatusCode)
	}
	require.Eventually(t, func() bool {
		aHere, aAll := followerCounts(t, a, "fq")
		bHere, bAll := followerCounts(t, b, "fq")
		return aHere == 0 && aAll == 2 && bHere == 2 && bAll == 2
	}, 10*time.Second, 20*time.Millisecond, "A counts B's two followers")
	cancel()
	require.Eventually(t, func() bool {
		_, aAll := followerCounts(t, a, "fq")
		return aAll == 0
	}, 10*time.Second, 20*time.Millisecond, "and none once they left")
}
