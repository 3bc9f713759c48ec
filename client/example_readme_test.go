package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue/queuetest"
)

// The Go SDK example of the README ("### Go SDK"), verbatim:
// TestIssue17_ReadmeGoBlocksAreExamples fails when the two differ, and
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

// The README's example against a real Herald on a free port.
func Example_readme() {
	base, shutdown := startExampleServer()
	defer shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pushAndBill(ctx, base, ""); err != nil {
		fmt.Println("error:", err)
	}
	// Output:
	// pushed: queued
	// billed o-1: 9.50
}

// startExampleServer starts a real Herald (gateway and poller) on the test
// database, in a schema of its own, as startServer does for tests; an
// Example has no *testing.T, so exampleTB stands in for one.
func startExampleServer() (base string, shutdown func()) {
	tb := &exampleTB{}
	store := queuetest.NewStore(tb)
	p, err := poller.New(poller.Config{Store: store})
	if err != nil {
		panic(err)
	}
	stopPoller := p.Start()
	gw, err := gateway.New(gateway.Config{Store: store, Poller: p})
	if err != nil {
		panic(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() {
		gw.Drain()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		gw.WaitStreams(ctx)
		_ = srv.Shutdown(ctx)
		gw.Close()
		stopPoller()
		tb.cleanup()
	}
}

// exampleTB is the testing.TB that pgtest and queuetest need, for an
// Example: a failure panics (which fails the test binary with the
// message), and cleanup runs the registered cleanups, last first. The
// embedded interface is nil: only the methods below may be called.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (*exampleTB) Helper()                        {}
func (*exampleTB) Name() string                   { return "Example_readme" }
func (*exampleTB) Logf(string, ...any)            {}
func (*exampleTB) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
func (*exampleTB) Errorf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
func (*exampleTB) Fatal(a ...any)                 { panic(fmt.Sprint(a...)) }
func (*exampleTB) Error(a ...any)                 { panic(fmt.Sprint(a...)) }
func (tb *exampleTB) Cleanup(f func())            { tb.cleanups = append(tb.cleanups, f) }
func (*exampleTB) Context() context.Context       { return context.Background() }
func (tb *exampleTB) cleanup() {
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
	tb.cleanups = nil
}
