package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

	"github.com/heraldmq/herald/client"
)

// Connect once per process; the client reconnects by itself.
func ExampleDial() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "http://localhost:6632", client.Options{
		Token: "", // a bearer token when the server runs with --auth-secret
		OnState: func(s client.State) {
			if s.Kind == client.StateReconnecting {
				log.Printf("herald: reconnecting (attempt %d in %v): %v", s.Attempt, s.Delay, s.Err)
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()
}

// A handler that returns nil acknowledges its message; an error fails it
// (it is delivered again, and dead-lettered after the queue's retry limit).
func ExampleClient_Subscribe() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := client.Dial(ctx, "http://localhost:6632", client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()

	type order struct {
		ID    string  `json:"id"`
		Total float64 `json:"total"`
	}
	err = c.Subscribe(ctx, client.SubscribeOptions{Queue: "orders", ConsumerGroup: "billing", MaxInFlight: 50},
		func(ctx context.Context, m *client.Message) error {
			var o order
			if err := json.Unmarshal(m.Data, &o); err != nil {
				return fmt.Errorf("not an order: %w", err) // failed: retried, then dead-lettered
			}
			fmt.Printf("bill %s: %.2f (partition %s)\n", o.ID, o.Total, m.Partition)
			return nil // acknowledged
		})
	if err != nil {
		log.Fatal(err)
	}
}

// With ManualAck the handler decides, and may acknowledge later.
func ExampleMessage_Ack() {
	ctx := context.Background()
	c, err := client.Dial(ctx, "http://localhost:6632", client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	_ = c.Subscribe(ctx, client.SubscribeOptions{Queue: "emails", ManualAck: true},
		func(ctx context.Context, m *client.Message) error {
			if m.RetryCount > 0 {
				return m.Settle(ctx, client.StatusDLQ, "no second attempts for emails")
			}
			return m.Ack(ctx)
		})
}

func ExampleClient_Push() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, "http://localhost:6632", client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	res, err := c.Push(ctx,
		client.PushItem{Queue: "orders", Partition: "customer-42", Payload: map[string]any{"id": "o-1", "total": 9.5},
			TransactionID: "o-1"}, // a repeated transaction id is stored once
	)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res[0].Status) // queued, or duplicate
}
