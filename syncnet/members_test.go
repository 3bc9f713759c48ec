package syncnet

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// members makes every node a member of the others, as internal/server does
// after each read of the members table.
func members(nodes ...*testNode) {
	for _, a := range nodes {
		var ms []Member
		for _, b := range nodes {
			if a != b {
				ms = append(ms, Member{ID: b.cfg.ServerID, Addr: b.Addr().String(), Session: b.Session(), Digest: b.Digest()})
			}
		}
		a.SetMembers(ms)
	}
}

func sentAll(t *testing.T, nd *testNode) float64 {
	t.Helper()
	var n float64
	for typ := range typeNames {
		n += sentTo(t, nd, typ)
	}
	return n
}

// A member with 100 consumed queues tells a new member all of them in a
// few datagrams (one PRESENCE_SET of many queues each), not one per queue.
func TestPresence_BatchedIntoFewDatagrams(t *testing.T) {
	nodes := mesh(t, 2, nil, func(_ int, c *Config) { c.Peers = nil })
	a, b := nodes[0], nodes[1]
	a.SetPeers(nil)
	b.SetPeers(nil)
	for i := range 100 {
		b.SetLocal(fmt.Sprintf("queue-%03d", i), true)
	}
	members(a, b)
	require.Eventually(t, func() bool {
		for i := range 100 {
			if has, known := a.HasSubscribers(fmt.Sprintf("queue-%03d", i)); !has || !known {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond, "a learns b's 100 queues")
	assert.LessOrEqual(t, sentTo(t, b, PresenceSet), 2.0, "100 queues in at most 2 datagrams")
	assert.Zero(t, sentTo(t, b, ConsumerRegistered), "none per queue")
	assert.True(t, a.Known("b:1"))
}

// Members whose presence agrees send nothing while idle: no heartbeats (the
// database says who is alive), no re-announcements (digests agree), however
// many queues they consume.
func TestPresence_NoIdleDatagramsBetweenMembers(t *testing.T) {
	nodes := mesh(t, 3, nil, func(_ int, c *Config) { c.Resolve = 100 * time.Millisecond })
	for _, nd := range nodes {
		nd.SetPeers(nil)
		for i := range 100 {
			nd.SetLocal(fmt.Sprintf("%s-queue-%03d", nd.cfg.ServerID, i), true)
		}
	}
	members(nodes...)
	require.Eventually(t, func() bool {
		members(nodes...)
		for _, a := range nodes {
			for _, b := range nodes {
				if a != b && !a.Known(b.cfg.ServerID) {
					return false
				}
			}
		}
		return true
	}, 5*time.Second, 20*time.Millisecond, "presence known everywhere")
	var before []float64
	for _, nd := range nodes {
		before = append(before, sentAll(t, nd))
	}
	// The idle span in the nodes' own time: an idle member's timer fires
	// every Resolve, and each firing runs every periodic duty (heartbeats,
	// re-announcements, resolving the seeds); five firings of every node,
	// with the members table read between them.
	woke := make([]uint64, len(nodes))
	for i, nd := range nodes {
		woke[i] = nd.wokeUp.Load()
	}
	require.Eventually(t, func() bool {
		members(nodes...)
		for i, nd := range nodes {
			if nd.wokeUp.Load() < woke[i]+5 {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "every node's periodic duties ran five times")
	for i, nd := range nodes {
		assert.Equal(t, before[i], sentAll(t, nd), "%s sent nothing while idle", nd.cfg.ServerID)
	}
}

// A presence change that is lost heals by the digest: the member's differs
// from what was heard, the reader pulls.
func TestPresence_LostChangeHealsByDigest(t *testing.T) {
	nodes := mesh(t, 2, func(t Type) bool { return t == ConsumerRegistered })
	a, b := nodes[0], nodes[1]
	a.SetPeers(nil)
	b.SetPeers(nil)
	members(a, b)
	require.Eventually(t, func() bool { return a.Known("b:1") }, 5*time.Second, 10*time.Millisecond)
	b.SetLocal("late", true) // its CONSUMER_REGISTERED is lost
	require.Eventually(t, func() bool {
		members(a, b) // the table's reads, every MemberRead in the server
		has, known := a.HasSubscribers("late")
		return has && known
	}, 10*time.Second, 50*time.Millisecond, "a pulls b's presence once b's digest stays different")
}

// A member that leaves the table leaves the peers at once: no wake-ups,
// no datagram at all to it.
func TestMembership_DepartedMemberLeavesAtOnce(t *testing.T) {
	nodes := mesh(t, 2, nil)
	a, b := nodes[0], nodes[1]
	a.SetPeers(nil)
	b.SetPeers(nil)
	b.SetLocal("q", true)
	members(a, b)
	require.Eventually(t, func() bool { has, known := a.HasSubscribers("q"); return has && known }, 5*time.Second, 10*time.Millisecond)
	a.SetMembers(nil) // b's row is gone
	has, known := a.HasSubscribers("q")
	assert.False(t, has)
	assert.True(t, known, "nobody left whose presence is unknown")
	before := sentAll(t, a)
	a.Notify("q", "p")
	a.QueueDeleted("q")
	assert.Equal(t, before, sentAll(t, a), "nothing sent to a departed member")
}

// A seed never heard from is dead after DeadAfter, not unknown forever: it
// no longer keeps presence from being known (NOTIFY skipping, targeting),
// and gets no heartbeat a second, only a probe every Resolve.
func TestNode_SeedNeverHeardIsDead(t *testing.T) {
	nodes := mesh(t, 1, nil, func(_ int, c *Config) {
		c.Peers, c.Resolve = []string{"127.0.0.1:9"}, time.Hour // discard: nobody answers
	})
	a := nodes[0]
	a.SetPeers([]string{"127.0.0.1:9"})
	require.Eventually(t, func() bool { _, known := a.HasSubscribers("q"); return known }, 10*time.Second, 10*time.Millisecond,
		"the silent seed is dead after DeadAfter (300 ms here)")
	beats := sentTo(t, a, Heartbeat)
	// The span in the node's own time: a seed that is not a member keeps
	// its timer at Heartbeat, and each firing runs the heartbeat duty.
	woke := a.wokeUp.Load()
	require.Eventually(t, func() bool { return a.wokeUp.Load() >= woke+6 }, 30*time.Second, 10*time.Millisecond,
		"the heartbeat duty ran six times")
	assert.Equal(t, beats, sentTo(t, a, Heartbeat), "no heartbeats to a dead seed")
}

// An idle member of a mesh found through the table has no periodic duty
// between Resolves (its peers' health and presence come from the table):
// its timer does not fire every Heartbeat. Each wake-up of an idle process
// costs the runtime more than the duty; at 100 instances the 1 s tick was
// a tenth of the mesh's idle CPU.
func TestNode_IdleMemberWakesOnlyEveryResolve(t *testing.T) {
	const resolve = 300 * time.Millisecond // 6 heartbeats
	nodes := mesh(t, 2, nil, func(_ int, c *Config) { c.Peers = nil; c.Resolve = resolve })
	a, b := nodes[0], nodes[1]
	a.SetPeers(nil)
	b.SetPeers(nil)
	members(a, b)
	require.Eventually(t, func() bool {
		members(a, b)
		return a.Known("b:1") && b.Known("a:1")
	}, 5*time.Second, 20*time.Millisecond, "presence known both ways")
	// What the greeting left to expire (a peer heard before the table
	// listed it) is gone within a few heartbeats.
	require.Eventually(t, func() bool { return !a.needsBeat() && !b.needsBeat() }, 5*time.Second, 20*time.Millisecond)
	// Four firings of a's timer, counted from before the first. Idle, the
	// last three are Resolve apart (each is armed Resolve after the one
	// before ran the resolve duty; the first may end a short wait armed
	// before the node went idle): at least two Resolves. Every Heartbeat,
	// they would take 150 ms. A loaded machine only makes them later.
	before, start := a.wokeUp.Load(), time.Now()
	require.Eventually(t, func() bool { return a.wokeUp.Load() >= before+4 }, 30*time.Second, 5*time.Millisecond,
		"a's timer fired four times")
	assert.GreaterOrEqual(t, time.Since(start), 2*resolve-resolve/10, "an idle member's timer fired more often than every Resolve")

	// Duties come back when due: a queue's last consumer leaving is
	// announced once Linger has passed, though the node was idle.
	b.SetLocal("q", true)
	require.Eventually(t, func() bool { has, known := a.HasSubscribers("q"); return has && known }, 10*time.Second, 10*time.Millisecond)
	b.SetLocal("q", false)
	require.Eventually(t, func() bool { has, _ := a.HasSubscribers("q"); return !has }, 10*time.Second, 10*time.Millisecond,
		"the deregistration went out after Linger")
}

// A member that is also a seed (--sync-peers) and whose row goes (it
// died) is dead, not unknown: it gets no wake-ups, where an unknown peer
// would get every one until DeadAfter had passed again.
func TestMembership_DepartedMemberThatIsASeedIsDead(t *testing.T) {
	nodes := mesh(t, 2, nil)
	a, b := nodes[0], nodes[1]
	a.SetPeers([]string{b.Addr().String()})
	b.SetPeers(nil)
	b.SetLocal("q", true)
	members(a, b)
	require.Eventually(t, func() bool { has, known := a.HasSubscribers("q"); return has && known }, 5*time.Second, 10*time.Millisecond)
	a.SetMembers(nil) // b's row is gone: it died
	has, known := a.HasSubscribers("q")
	assert.False(t, has)
	assert.True(t, known, "the departed seed is dead: nobody left whose presence is unknown")
	before := sentTo(t, a, MessageAvailable)
	a.Notify("q", "p")
	assert.Equal(t, before, sentTo(t, a, MessageAvailable), "no wake-up to a departed member that is also a seed")
}

// A member's lease hint holds however long the member has been silent:
// members send no heartbeats (the database says who is alive), so silence
// is no sign of death; a hint is dropped when the member leaves the table.
func TestLeaseHint_SilentMemberStillHoldsItsLease(t *testing.T) {
	nodes := mesh(t, 2, nil, func(_ int, c *Config) { c.DeadAfter = 20 * time.Millisecond })
	a, b := nodes[0], nodes[1]
	a.SetPeers(nil)
	b.SetPeers(nil)
	a.SetLocal("q", true) // b's hints go to members with consumers of q
	members(a, b)
	require.Eventually(t, func() bool { has, known := b.HasSubscribers("q"); return has && known },
		5*time.Second, 10*time.Millisecond)
	b.LeaseAcquired("q", "p", "pid-1", "g", time.Now().Add(time.Minute))
	require.Eventually(t, func() bool { return a.Stats().LeaseHints == 1 }, 5*time.Second, time.Millisecond)
	// Ten times DeadAfter of silence from b: the hint still holds.
	assert.Never(t, func() bool {
		until, audit := a.LeasedElsewhere("pid-1", "g")
		return until.IsZero() && !audit
	}, 10*a.cfg.DeadAfter, a.cfg.DeadAfter/4, "b's hint is honoured while b is a member")
	assert.Zero(t, a.Stats().Counters["hint:holder_dead"])

	a.SetMembers(nil) // b's row is gone
	until, audit := a.LeasedElsewhere("pid-1", "g")
	assert.True(t, until.IsZero() && !audit, "a departed member's hint is ignored")
}
