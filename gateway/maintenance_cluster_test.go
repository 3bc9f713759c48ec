package gateway_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/internal/server"
	"github.com/heraldmq/herald/internal/server/servertest"
)

// newInstance starts a whole instance (internal/server, as herald serve
// runs it) on dsn, a schema other instances may share; mode is a
// servertest mode (its wake source). The env talks to it over HTTP.
func newInstance(t *testing.T, dsn, mode string, adjust ...func(*server.Config)) (*env, *servertest.Instance) {
	t.Helper()
	in := servertest.Start(t, dsn, mode, adjust...)
	return &env{t: t, store: in.Store(), srv: in.Gateway(), url: in.URL(), client: http.DefaultClient, p: in.Poller()}, in
}

// newCluster starts two instances on one schema (internal/server, as
// herald serve runs them), each with its own push buffer. via says how an
// instance hears of a switch made on the other: "notify" (the switch's
// NOTIFY, through the LISTEN connection), "syncnet" (a
// MAINTENANCE_MODE_SET datagram on loopback) or "periodic" (neither: only
// its own periodic read, every 200 ms here). With notify and syncnet the
// periodic read is a minute, so only the message explains a prompt switch.
func newCluster(t *testing.T, via string) (a, b *env) {
	t.Helper()
	dsn := servertest.SharedDSN(t)
	mode := map[string]string{"notify": "notify", "syncnet": "syncnet", "periodic": "none"}[via]
	if mode == "" {
		t.Fatalf("unknown via %q", via)
	}
	var ins []*servertest.Instance
	var envs []*env
	for _, name := range []string{"a", "b"} {
		e, in := newInstance(t, dsn, mode, func(c *server.Config) {
			c.InstanceID, c.BufferDir = name, t.TempDir()
			c.Adjust.Gateway = func(g *gateway.Config) {
				g.MaintenanceRefresh = time.Minute
				if via == "periodic" {
					g.MaintenanceRefresh = 200 * time.Millisecond
				}
			}
		})
		ins = append(ins, in)
		envs = append(envs, e)
	}
	if via == "syncnet" {
		servertest.Link(ins...)
		// Each sees the other alive (the shared database may list other
		// tests' instances too).
		hears := func(in, other *servertest.Instance) bool {
			id := other.Node().Stats().ServerID
			for _, p := range in.Node().Stats().Peers {
				if p.ID == id && p.Alive {
					return true
				}
			}
			return false
		}
		require.Eventually(t, func() bool { return hears(ins[0], ins[1]) && hears(ins[1], ins[0]) },
			10*time.Second, 10*time.Millisecond, "the nodes hear each other")
	}
	return envs[0], envs[1]
}

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
			assert.Less(t, time.Since(start), 10*time.Second, "a pop on B answers 204 at once, not at its 30 s timeout")
			// The gauge follows the switch (it may be set just after the
			// pause that answered the long-poll).
			within(t, bound, func() bool { return b.metric("herald_pop_maintenance_mode") == "1" }, "B's gauge says pop maintenance")

			// Off, switched on B: A drains (and B).
			b.setMaintenance("", false)
			b.setMaintenance("/pop", false)
			within(t, bound, func() bool {
				return a.metric("herald_buffer_messages") == "0" && b.metric("herald_buffer_messages") == "0"
			}, "both buffers drain")
			within(t, bound, func() bool {
				return a.metric("herald_maintenance_mode") == "0" && a.metric("herald_pop_maintenance_mode") == "0"
			}, "A learns both switches are off")
			assert.Equal(t, []int{0, 1, 2, 0, 1, 2}, a.storedPayloads("two"), "partition a's, then b's: each in order, each once")
			assert.Equal(t, "3", a.metric("herald_buffer_drained_total"))
			assert.Equal(t, "3", b.metric("herald_buffer_drained_total"))
			r := a.pop("/api/v1/pop/queue/two/partition/a?batch=10&autoAck=true")
			assert.Len(t, r.Messages, 3, "visible to pops now")
		})
	}
}
