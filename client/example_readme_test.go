package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/heraldmq/herald/client"
)

// The Go SDK example of docs/clients.md ("## Go SDK"), verbatim:
// TestReadme_GoBlocksAreExamples fails when the two differ, and
// Example_readme runs it against a real Herald.

// pushAndBill pushes an order to the queue "orders" and bills it in the consumer group "billing".
// base is the server's URL; token is a bearer token when it runs with --auth-secret, else "".
func pushAndBill(ctx context.Context, base, token string) error {
	c, err := client.Dial(ctx, base, client.Options{Token: token})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()

	type order struct {
		ID    string  `json:"id"`
		Total float64 `json:"total"`
	}
	billed := make(chan order, 1)

	// Subscribe consumes until its context ends, so it runs in a goroutine of its own.
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- c.Subscribe(subCtx, client.SubscribeOptions{Queue: "orders", ConsumerGroup: "billing", MaxInFlight: 50},
			// A nil error acks the message; an error fails it with the error's text
			// (it comes again, and goes to the dead-letter queue after the queue's retryLimit).
			func(ctx context.Context, m *client.Message) error {
				var o order
				if err := json.Unmarshal(m.Data, &o); err != nil {
					return fmt.Errorf("not an order: %w", err)
				}
				select {
				case billed <- o:
					return nil
				case <-ctx.Done():
					return ctx.Err() // not acked: delivered again
				}
			})
	}()

	res, err := c.Push(ctx, client.PushItem{Queue: "orders", Partition: "customer-42", Payload: order{ID: "o-1", Total: 9.5}})
	if err != nil {
		return err
	}
	fmt.Println("pushed:", res[0].Status) // queued

	select {
	case o := <-billed:
		fmt.Printf("billed %s: %.2f\n", o.ID, o.Total)
	case err := <-done:
		return err // the server refused the subscription
	case <-ctx.Done():
		return ctx.Err()
	}
	stop() // ends Subscribe, which then returns nil
	return <-done
}

// The example of docs/clients.md against the real Herald TestMain started.
func Example_readme() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pushAndBill(ctx, shared.url(), ""); err != nil {
		fmt.Println("error:", err)
	}
	// Output:
	// pushed: queued
	// billed o-1: 9.50
}
