package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/internal/shared"
	"github.com/heraldmq/herald/pgnotify"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/syncnet"
)

// newCluster starts two instances on one schema, each with its own pool,
// store, poller, gateway, push buffer and maintenance loop, as cmd/herald
// wires them. via says how an instance hears of a switch made on the
// other: "notify" (the switch's NOTIFY, through a pgnotify Listener),
// "syncnet" (a MAINTENANCE_MODE_SET datagram on loopback) or "periodic"
// (neither: only its own periodic read, every 200 ms here). With notify
// and syncnet the periodic read is a minute, so only the message explains
// a prompt switch.
func newCluster(t *testing.T, via string) (a, b *env) {
	t.Helper()
	dsn := pgtest.DSN(t)
	pool, err := queue.NewPool(context.Background(), dsn, 0)
	require.NoError(t, err)
	_, err = queue.Migrate(context.Background(), pool)
	pool.Close()
	require.NoError(t, err)
	var nodes []*syncnet.Node
	var ins []*env
	for _, name := range []string{"a", "b"} {
		pool, err := queue.NewPool(context.Background(), dsn, 0)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		store, err := queue.New(queue.Config{Pool: pool, InstanceID: name})
		require.NoError(t, err)
		var srv *gateway.Server // told of switches by the listener or the node
		refresh := func() { srv.RefreshMaintenance() }
		var runs []func(context.Context) error
		var ready <-chan struct{}
		cfg := func(c *gateway.Config) {
			c.BufferDir, c.MaintenanceRefresh, c.Instance = t.TempDir(), time.Minute, name
		}
		var extra func(*gateway.Config)
		switch via {
		case "notify":
			ls, err := pgnotify.NewListener(pgnotify.ListenerConfig{Pool: pool, Waker: nopWaker{}, OnState: refresh,
				BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond})
			require.NoError(t, err)
			runs, ready = append(runs, ls.Run), ls.Connected()
		case "syncnet":
			scfg := syncnet.Config{Bind: "127.0.0.1:0", Secret: strings.Repeat("cd", 32), ServerID: name + ":1",
				Waker: syncnet.WakerFunc(func(string, string, string) {}), Heartbeat: 100 * time.Millisecond,
				Announce: 200 * time.Millisecond, OnMaintenance: func(bool, bool) { refresh() }}
			shared.Hook(&scfg, store)
			node, err := syncnet.New(scfg)
			require.NoError(t, err)
			nodes = append(nodes, node)
			runs = append(runs, node.Run)
			extra = func(c *gateway.Config) { c.OnMaintenance = node.MaintenanceSet }
		case "periodic":
			extra = func(c *gateway.Config) { c.MaintenanceRefresh = 200 * time.Millisecond }
		default:
			t.Fatalf("unknown via %q", via)
		}
		e := newEnvOn(t, store, nil, cfg, func(c *gateway.Config) {
			if extra != nil {
				extra(c)
			}
		})
		srv = e.srv
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for _, run := range runs {
			wg.Go(func() { _ = run(ctx) })
		}
		t.Cleanup(func() {
			cancel()
			wg.Wait()
		})
		e.runMaintenance()
		if ready != nil {
			select {
			case <-ready:
			case <-time.After(10 * time.Second):
				t.Fatal("the listener did not start")
			}
		}
		ins = append(ins, e)
	}
	if len(nodes) == 2 {
		nodes[0].SetPeers([]string{nodes[1].Addr().String()})
		nodes[1].SetPeers([]string{nodes[0].Addr().String()})
		require.Eventually(t, func() bool {
			for _, n := range nodes {
				if st := n.Stats(); len(st.Peers) != 1 || !st.Peers[0].Alive {
					return false
				}
			}
			return true
		}, 10*time.Second, 10*time.Millisecond, "the nodes hear each other")
	}
	return ins[0], ins[1]
}

type nopWaker struct{}

func (nopWaker) Wake(string, string, string) {}
func (nopWaker) WakeAll(string)              {}

// within waits up to bound for cond, checking every 5 ms.
func within(t *testing.T, bound time.Duration, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, bound, 5*time.Millisecond, msg)
}

// Maintenance switched on instance A reaches instance B promptly: B's
// pushes are buffered, its pops and waiting long-polls answer 204.
// Switched off on B, it reaches A, whose buffer (and B's) drains: every
// message once, each instance's in the order it buffered them.
func TestMaintenance_TwoInstances(t *testing.T) {
	for _, via := range []string{"notify", "syncnet", "periodic"} {
		t.Run(via, func(t *testing.T) {
			a, b := newCluster(t, via)
			const bound = 2 * time.Second // with a minute between periodic reads: the message did it

			a.setMaintenance("", true)
			within(t, bound, func() bool { return b.metric("herald_maintenance_mode") == "1" }, "B learns push maintenance")
			for i := range 3 {
				b.pushBuffered(fmt.Sprintf(`[{"queue":"two","partition":"b","payload":%d}]`, i))
				a.pushBuffered(fmt.Sprintf(`[{"queue":"two","partition":"a","payload":%d}]`, i))
			}
			assert.Zero(t, a.count(`SELECT count(*) FROM messages`), "nothing written while it is on")

			// A long-poll waits on B; pop maintenance switched on A answers it.
			got := make(chan resp, 1)
			before := b.p.Intentions()
			go func() { got <- b.get("/api/v1/pop/queue/two?wait=true&timeout=60000") }()
			within(t, 10*time.Second, func() bool { return b.p.Intentions() > before }, "the long-poll waits")
			a.setMaintenance("/pop", true)
			select {
			case r := <-got:
				assert.Equal(t, http.StatusNoContent, r.status)
			case <-time.After(bound):
				t.Fatal("B's waiting long-poll was not answered within the bound")
			}
			start := time.Now()
			b.popEmpty("/api/v1/pop/queue/two?wait=true&timeout=30000")
			assert.Less(t, time.Since(start), time.Second, "a pop on B answers 204 at once")
			// The gauge follows the switch (it may be set just after the
			// pause that answered the long-poll).
			within(t, bound, func() bool { return b.metric("herald_pop_maintenance_mode") == "1" }, "B's gauge says pop maintenance")

			// Off, switched on B: A drains (and B).
			b.setMaintenance("", false)
			b.setMaintenance("/pop", false)
			within(t, bound, func() bool {
				return a.metric("herald_buffer_messages") == "0" && b.metric("herald_buffer_messages") == "0"
			}, "both buffers drain")
			assert.Equal(t, "0", a.metric("herald_maintenance_mode"))
			assert.Equal(t, "0", a.metric("herald_pop_maintenance_mode"))
			assert.Equal(t, []int{0, 1, 2, 0, 1, 2}, a.storedPayloads("two"), "partition a's, then b's: each in order, each once")
			assert.Equal(t, "3", a.metric("herald_buffer_drained_total"))
			assert.Equal(t, "3", b.metric("herald_buffer_drained_total"))
			r := a.pop("/api/v1/pop/queue/two/partition/a?batch=10&autoAck=true")
			assert.Len(t, r.Messages, 3, "visible to pops now")
		})
	}
}
