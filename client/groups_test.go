package client_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/client"
)

// Several subscriptions of one client (one socket) to the same
// queue in different groups, with automatic and manual acks side by side:
// every handler runs once per message, every group finishes, nothing is
// dead-lettered.
func TestSubscribe_GroupsOnOneSocket(t *testing.T) {
	t.Parallel()
	s := shared
	c := dial(t, s, client.Options{})
	s.post(t, `/api/v1/configure`, `{"queue":"sdk-one-socket","options":{"retryLimit":1}}`)
	const n = 20
	push(t, c, "sdk-one-socket", 1, n)

	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var mu sync.Mutex
	runs := map[string]map[string]int{} // group → payload → handler runs
	var wg sync.WaitGroup
	for _, g := range []struct {
		name   string
		manual bool
	}{{"auto", false}, {"manual", true}, {"third", false}} {
		runs[g.name] = map[string]int{}
		wg.Go(func() {
			_ = c.Subscribe(ctx, client.SubscribeOptions{Queue: "sdk-one-socket", ConsumerGroup: g.name, Batch: 5, ManualAck: g.manual},
				func(hctx context.Context, m *client.Message) error {
					mu.Lock()
					runs[g.name][string(m.Data)]++
					mu.Unlock()
					if g.manual {
						return m.Ack(hctx)
					}
					return nil
				})
		})
	}
	lag := -1
	require.Eventually(t, func() bool {
		pos := s.groupPositions(t, "sdk-one-socket")
		lag = 0
		for _, g := range []string{"auto", "manual", "third"} {
			p, ok := pos[g]
			if !ok {
				lag = -1 // no position yet
				break
			}
			lag += p.Lag
		}
		mu.Lock()
		defer mu.Unlock()
		return lag == 0 && len(runs["auto"]) == n && len(runs["manual"]) == n && len(runs["third"]) == n
	}, 15*time.Second, 20*time.Millisecond, "every group finishes (lag %d)", lag)
	cancel()
	wg.Wait()
	assert.Zero(t, s.deadLetters(t, "sdk-one-socket"), "nothing dead-lettered")
	for g, byMsg := range runs {
		for p, k := range byMsg {
			assert.Equal(t, 1, k, "group %s ran message %s %d times", g, p, k)
		}
	}
}
