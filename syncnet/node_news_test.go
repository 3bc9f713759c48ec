package syncnet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// QUEUE_CONFIG_SET and PARTITION_DELETED reach the peers' callbacks.
func TestNode_ConfigAndPartitionNews(t *testing.T) {
	type cfgNews struct {
		queue   string
		c       QueueConfig
		version uint64
	}
	configs := make(chan cfgNews, 1)
	parts := make(chan string, 1)
	nodes := mesh(t, 2, nil, func(i int, c *Config) {
		if i == 1 {
			c.OnQueueConfig = func(q string, cfg QueueConfig, v uint64) {
				select { // a resent copy may come too
				case configs <- cfgNews{q, cfg, v}:
				default:
				}
			}
			c.OnPartitionDeleted = func(q, p string) { parts <- q + "/" + p }
		}
	})
	want := QueueConfig{ID: "0190a1b2-0000-7000-8000-000000000001", LeaseTime: 45, RetryLimit: 2, DLQEnabled: true}
	// News is one datagram, best effort (a peer drops one from a sender
	// it has not heard a heartbeat from yet): send again until it lands.
	resend := time.NewTicker(200 * time.Millisecond)
	defer resend.Stop()
	deadline := time.After(5 * time.Second)
	nodes[0].QueueConfigured("orders", want, 7)
config:
	for {
		select {
		case got := <-configs:
			assert.Equal(t, cfgNews{"orders", want, 7}, got)
			break config
		case <-resend.C:
			nodes[0].QueueConfigured("orders", want, 7)
		case <-deadline:
			t.Fatal("QUEUE_CONFIG_SET did not arrive")
		}
	}
	nodes[0].PartitionDeleted("orders", "customer-1")
	select {
	case got := <-parts:
		assert.Equal(t, "orders/customer-1", got)
	case <-time.After(5 * time.Second):
		t.Fatal("PARTITION_DELETED did not arrive")
	}
}

// A lease hint lives a fifth of the lease, is dropped by the release (which
// wakes the partition's consumers), and is ignored once its holder is dead.
func TestNode_LeaseHints(t *testing.T) {
	nodes := mesh(t, 2, nil)
	a, b := nodes[0], nodes[1]
	a.SetLocal("q", true) // B's hints go to peers with consumers of q
	require.Eventually(t, func() bool { has, known := b.HasSubscribers("q"); return has && known },
		5*time.Second, 10*time.Millisecond)

	acquired := time.Now()
	b.LeaseAcquired("q", "p", "pid-1", "g", acquired.Add(10*time.Second))
	require.Eventually(t, func() bool { return a.Stats().LeaseHints == 1 }, 10*time.Second, time.Millisecond)
	var until time.Time
	for until.IsZero() { // 1% of lookups are audits
		until, _ = a.LeasedElsewhere("pid-1", "g")
	}
	assert.WithinDuration(t, acquired.Add(2*time.Second), until, 300*time.Millisecond, "TTL = lease time / 5")
	u, audit := a.LeasedElsewhere("pid-1", "other-group")
	assert.True(t, u.IsZero() && !audit, "no hint for another group")

	// About 1 in 100 lookups ignores the hint.
	audits := 0
	for range 10000 {
		if _, audit := a.LeasedElsewhere("pid-1", "g"); audit {
			audits++
		}
	}
	assert.InDelta(t, 100, audits, 40, "1%% audited (±4 standard deviations)")
	a.HintAudited(true)
	a.HintAudited(false)
	a.HintAudited(true)
	assert.InDelta(t, 2.0/3, a.Stats().HintAccuracy, 1e-9)

	b.LeaseReleased("q", "p", "pid-1", "g")
	select {
	case got := <-a.wakes.ch:
		assert.Equal(t, "q/p", got, "the release wakes the partition's consumers")
	case <-time.After(2 * time.Second):
		t.Fatal("the release did not wake A")
	}
	u, audit = a.LeasedElsewhere("pid-1", "g")
	assert.True(t, u.IsZero() && !audit, "released: no hint")

	// A dead holder's hint is ignored.
	b.LeaseAcquired("q", "p", "pid-2", "g", time.Now().Add(time.Minute))
	require.Eventually(t, func() bool { return a.Stats().LeaseHints == 1 }, 10*time.Second, time.Millisecond)
	b.stop()
	require.Eventually(t, func() bool {
		u, audit := a.LeasedElsewhere("pid-2", "g")
		return u.IsZero() && !audit
	}, 2*time.Second, 10*time.Millisecond, "holder dead: hint ignored")
	assert.Positive(t, a.Stats().Counters["hint:holder_dead"])
}

// The node asks for an 8 MB receive buffer and reports what the kernel
// granted (capped by net.core.rmem_max; the node warns when it is less).
func TestNode_ReportsReceiveBuffer(t *testing.T) {
	nd := mesh(t, 1, nil)[0]
	got := nd.Stats().RecvBuffer
	assert.Positive(t, got)
	assert.LessOrEqual(t, got, RecvBufferBytes)
	t.Logf("receive buffer granted: %d bytes of %d asked", got, RecvBufferBytes)
}

// A queue's last consumer leaving is announced only after Linger: one that
// polls again meanwhile costs no datagram and is no news to the peers.
func TestNode_PresenceLingers(t *testing.T) {
	nodes := mesh(t, 2, nil, func(_ int, c *Config) { c.Linger = 300 * time.Millisecond })
	a, b := nodes[0], nodes[1]
	assert.True(t, b.SetLocal("lp", true), "the first consumer is news")
	require.Eventually(t, func() bool { has, _ := a.HasSubscribers("lp"); return has }, 5*time.Second, time.Millisecond)
	sent := sentTo(t, b, ConsumerRegistered) + sentTo(t, b, ConsumerDeregistered)
	for range 20 { // a long-poll consumer: answered, polls again
		assert.False(t, b.SetLocal("lp", false))
		assert.False(t, b.SetLocal("lp", true), "back within Linger: no news")
	}
	assert.LessOrEqual(t, sentTo(t, b, ConsumerRegistered)+sentTo(t, b, ConsumerDeregistered), sent+1,
		"no datagram but, at most, one periodic re-announcement")
	b.SetLocal("lp", false)
	has, _ := b.HasSubscribers("lp")
	assert.False(t, has, "no local consumer while lingering")
	require.Eventually(t, func() bool { has, _ := a.HasSubscribers("lp"); return !has }, 5*time.Second, time.Millisecond,
		"deregistered once Linger passed")
	// a may also stop counting b's consumer by itself (a late heartbeat on
	// a loaded machine): wait for b's own deregistration.
	require.Eventually(t, func() bool { return sentTo(t, b, ConsumerDeregistered) > 0 }, 5*time.Second, time.Millisecond,
		"b sent the deregistration once Linger passed")
	assert.True(t, b.SetLocal("lp", true), "after the deregistration a consumer is news again")
}

// FuzzHandle: any correctly signed payload, of any type, is applied or
// counted and dropped; nothing panics and no callback sees an empty queue.
func FuzzHandle(f *testing.F) {
	for _, v := range []any{
		MessageAvailablePayload{Queue: "q", Partition: "p", TS: 1},
		QueueConfigSetPayload{Queue: "q", Config: QueueConfig{ID: "x", LeaseTime: 30}, Version: 2},
		QueueConfigDeletePayload{Queue: "q"},
		PartitionDeletedPayload{Queue: "q", Partition: "p"},
		LeaseHintPayload{ConsumerGroup: "g", ExpiresAtMS: 1 << 62, PartitionID: "pid", Queue: "q", Partition: "p"},
		presencePayload{Queue: "q"},
		HeartbeatPayload{SessionID: "s", Sequence: 1},
	} {
		b, err := Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		for _, typ := range []Type{MessageAvailable, QueueConfigSet, QueueConfigDelete, PartitionDeleted,
			LeaseHintAcquired, LeaseHintReleased, ConsumerRegistered, Heartbeat} {
			f.Add(uint8(typ), b)
		}
	}
	empty := func(q string) {
		if q == "" {
			panic("a callback with no queue")
		}
	}
	nd, err := New(Config{Bind: "127.0.0.1:0", ServerID: "fuzz:1", Secret: "k", Waker: WakerFunc(func(_, q, _ string) { empty(q) }),
		OnQueueDeleted: empty, OnPartitionDeleted: func(q, _ string) { empty(q) },
		OnQueueConfig: func(q string, _ QueueConfig, _ uint64) { empty(q) }})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = nd.conn.Close() })
	var seq uint64
	f.Fuzz(func(t *testing.T, typ uint8, payload []byte) {
		if len(payload) > MaxPayload {
			return
		}
		seq++
		b, err := Encode(Header{Type: Type(typ), SenderID: "peer:1", Session: "s", Sequence: seq}, payload, nd.key)
		if err != nil {
			t.Fatal(err)
		}
		nd.handle(b, nd.Addr().AddrPort())
		_, _ = nd.LeasedElsewhere("pid", "g")
	})
}
