package pgnotify_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldmq/herald/internal/server/servertest"
	"github.com/heraldmq/herald/queue"
)

// BenchmarkCrossInstance measures push (through instance A) → long-poll
// return (on instance B) per wake mode, side by side, over real HTTP: one
// queue at a time (the wake-up path alone) and 10 queues at a time (pushes
// and deliveries competing for the same two cores), 1,000 samples each
// (200 one at a time with poll, whose samples take 100 ms and more).
//
//	go test -run '^$' -bench CrossInstance -benchtime 1x ./pgnotify
func BenchmarkCrossInstance(b *testing.B) {
	for _, mode := range []string{"syncnet", "notify", "logical", "poll"} {
		for _, queues := range []int{1, 10} {
			b.Run(fmt.Sprintf("wake=%s/queues=%d", mode, queues), func(b *testing.B) {
				dsn := servertest.SharedDSN(b)
				producer := "none"
				if mode == "notify" || mode == "syncnet" {
					producer = mode
				}
				a, c := servertest.Start(b, dsn, producer), servertest.Start(b, dsn, mode)
				if mode == "syncnet" {
					servertest.Link(a, c)
				}
				n := 1000
				if mode == "poll" && queues == 1 {
					n = 200
				}
				for b.Loop() {
					lat := crossSamples(b, a, c, n, queues)
					slices.Sort(lat)
					b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
					b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "p99-ms")
					b.ReportMetric(float64(lat[len(lat)-1])/1e6, "max-ms")
				}
			})
		}
	}
}

func crossSamples(b *testing.B, a, c *servertest.Instance, n, queues int) []time.Duration {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * queues}}
	defer client.CloseIdleConnections()
	var out []time.Duration
	for round := 0; len(out) < n; round++ {
		before := c.Poller().Intentions()
		returned := make([]time.Time, queues)
		var wg sync.WaitGroup
		for q := range queues {
			wg.Go(func() {
				res, err := client.Get(fmt.Sprintf("%s/api/v1/pop/queue/x-%d?wait=true&timeout=10000&autoAck=true", c.URL(), q))
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				_ = res.Body.Close()
				returned[q] = time.Now()
				if res.StatusCode != http.StatusOK {
					b.Errorf("long-poll answered %d", res.StatusCode)
				}
			})
		}
		if !servertest.WaitFor(10*time.Second, nil, func() bool { return c.Poller().Intentions() >= before+queues }) {
			b.Fatalf("round %d: long-polls did not all wait", round)
		}
		pushed := make([]time.Time, queues)
		for q := range queues {
			pushed[q] = time.Now()
			res, err := client.Post(a.URL()+"/api/v1/push", "application/json",
				strings.NewReader(fmt.Sprintf(`{"items":[{"queue":"x-%d","payload":{"r":%d}}]}`, q, round)))
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
		}
		wg.Wait()
		for q := range queues {
			out = append(out, returned[q].Sub(pushed[q]))
		}
	}
	return out
}

// BenchmarkPushWithListeners measures push throughput at batch 10 (as the
// gateway pushes: store, then Notify) with no other instance, and with 3
// instances listening on the same database.
//
//	go test -run '^$' -bench PushWithListeners -benchtime 5s ./pgnotify
func BenchmarkPushWithListeners(b *testing.B) {
	for _, listeners := range []int{0, 3} {
		b.Run(fmt.Sprintf("listeners=%d", listeners), func(b *testing.B) {
			dsn := servertest.SharedDSN(b)
			a := servertest.Start(b, dsn, "notify")
			for range listeners {
				servertest.Start(b, dsn, "notify")
			}
			items := make([]queue.PushItem, 10)
			for i := range items {
				items[i] = queue.PushItem{Queue: "tp", Payload: []byte(`{"orderId":12345,"amount":99.5}`)}
			}
			start := time.Now()
			n := 0
			for b.Loop() {
				if _, err := a.Store().Push(context.Background(), items); err != nil {
					b.Fatal(err)
				}
				a.Notifier().Notify("tp", "Default")
				n++
			}
			b.ReportMetric(float64(n*len(items))/time.Since(start).Seconds(), "msgs/s")
			b.ReportMetric(float64(a.Notifier().Sent()), "notifies")
		})
	}
}
