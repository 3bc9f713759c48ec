package client_test

import (
	"context"
	"fmt"
	"time"

	"github.com/heraldmq/herald/client"
)

// followScores follows the queue "scores" from its beginning until it has
// seen n messages, and returns the event id to resume after. Every
// follower sees every message: a browser per user, a dashboard each, with
// no consumer group between them.
func followScores(ctx context.Context, base string, n int) (string, error) {
	c, err := client.Dial(ctx, base, client.Options{})
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }()
	for _, score := range []string{"1-0", "1-1", "2-1"} {
		if _, err := c.Push(ctx, client.PushItem{Queue: "scores", Payload: score}); err != nil {
			return "", err
		}
	}

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	last, seen := "", 0
	err = c.Follow(ctx, client.FollowOptions{
		Queue: "scores",
		From:  "beginning", // or "now", a time, or an event id to resume after
		OnGap: func(g client.Gap) { fmt.Println("retention deleted messages through", g.GoneThrough) },
	}, func(_ context.Context, m *client.Message) error {
		fmt.Println("score:", string(m.Data))
		last = m.EventID // the position is the follower's: keep it to resume later
		if seen++; seen == n {
			stop()
		}
		return nil
	})
	return last, err
}

// Follow a queue: every message, in order, resumed after a reconnect
// from the last event id by itself.
func ExampleClient_Follow() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	last, err := followScores(ctx, shared.url(), 3)
	if err != nil {
		fmt.Println("error:", err)
	}
	fmt.Println("resume after an event id:", last != "")
	// Output:
	// score: "1-0"
	// score: "1-1"
	// score: "2-1"
	// resume after an event id: true
}
