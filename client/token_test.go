package client_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/client"
)

// The Go SDK takes a token provider, asked on every connection
// and push and before the live token expires: a subscription outlives many
// short-lived tokens without a reconnect.
func TestTokenSource_RefreshesBeforeExpiry(t *testing.T) {
	t.Parallel()
	const secret = "0123456789abcdef0123456789abcdef"
	s := newHerald(t, "--auth-secret", secret)
	var asked atomic.Int64
	var reconnects atomic.Int64
	fifth := make(chan struct{}) // closed when the source was asked five times
	var once sync.Once
	c := dial(t, s, client.Options{
		TokenSource: func(ctx context.Context) (string, error) {
			if asked.Add(1) >= 5 {
				once.Do(func() { close(fifth) })
			}
			// 5 s (exp is whole seconds: 4–5 s of life): the refresh at 4/5
			// of it leaves a second for a busy machine.
			return heraldToken(ctx, secret, "svc", "read-write", 5*time.Second)
		},
		OnState: func(st client.State) {
			if st.Kind == client.StateReconnecting {
				reconnects.Add(1)
			}
		},
	})
	got := make(chan int, 10)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	go func() {
		_ = c.Subscribe(ctx, client.SubscribeOptions{Queue: "sdk-refresh"}, func(_ context.Context, m *client.Message) error {
			got <- int(m.Offset)
			return nil
		})
	}()
	push(t, c, "sdk-refresh", 1, 1)
	<-got
	// Past two tokens' lifetimes: the connection is refreshed, not closed.
	select {
	case <-fifth:
	case <-time.After(30 * time.Second):
		t.Fatal("the token source was not asked five times")
	}
	push(t, c, "sdk-refresh", 2, 2)
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no delivery after the first tokens expired")
	}
	t.Logf("token source asked %d times, %d reconnects", asked.Load(), reconnects.Load())
	assert.GreaterOrEqual(t, asked.Load(), int64(5), "asked at dial, pushes and before each expiry")
	assert.Zero(t, reconnects.Load(), "refreshed in place, never closed with 4501")
	require.NoError(t, c.Close())
}
