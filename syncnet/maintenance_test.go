package syncnet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A maintenance switch on one node reaches its peers' OnMaintenance, push
// and pop modes apart, as the reference server's types 40 and 41.
func TestNode_MaintenanceReachesPeers(t *testing.T) {
	type news struct{ pop, enabled bool }
	got := make(chan news, 4)
	nodes := mesh(t, 2, nil, func(i int, c *Config) {
		if i == 1 {
			c.OnMaintenance = func(pop, enabled bool) { got <- news{pop, enabled} }
		}
	})
	require.Eventually(t, func() bool { _, known := nodes[0].HasSubscribers("q"); return known }, 5*time.Second, 10*time.Millisecond)
	for _, want := range []news{{false, true}, {true, true}, {true, false}, {false, false}} {
		nodes[0].MaintenanceSet(want.pop, want.enabled)
		select {
		case n := <-got:
			assert.Equal(t, want, n)
		case <-time.After(2 * time.Second):
			t.Fatalf("the peer was not told %+v", want)
		}
	}
	assert.Equal(t, 2.0, sentTo(t, nodes[0], MaintenanceModeSet))
	assert.Equal(t, 2.0, sentTo(t, nodes[0], PopMaintenanceModeSet))
}
