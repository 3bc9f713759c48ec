package gateway_test

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

	"github.com/heraldmq/herald/poller"
)

// BenchmarkLongPoll measures, for each wake mode side by side, the time from
// the start of a push request to the return of a long-poll waiting on that
// queue (p50/p99 over ≥ 1,000 samples, over real HTTP), and the database
// statements per second spent on 1,000 idle long-polls.
//
//	go test -run '^$' -bench LongPoll -benchtime 1x ./gateway
func BenchmarkLongPoll(b *testing.B) {
	for _, mode := range []poller.WakeMode{poller.WakePush, poller.WakePoll} {
		b.Run("wake="+string(mode), func(b *testing.B) {
			e := newEnvPolling(b, func(c *poller.Config) { c.Mode = mode })
			for b.Loop() {
				lat := latencySamples(b, e, 1000, benchQueues)
				slices.Sort(lat)
				b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
				b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
				b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
				b.ReportMetric(idleQueriesPerSecond(b, e, 1000, 10, 20*time.Second), "idle-queries/s")
			}
		})
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// latencySamples runs rounds of `queues` long-polls (one per queue) and one
// push per queue until it has n samples of push-start → long-poll-return.
func latencySamples(b *testing.B, e *env, n, queues int) []time.Duration {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * queues}}
	defer client.CloseIdleConnections()
	var out []time.Duration
	for round := 0; len(out) < n; round++ {
		before := e.p.Intentions()
		returned := make([]time.Time, queues)
		var wg sync.WaitGroup
		for q := range queues {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := client.Get(fmt.Sprintf("%s/api/v1/pop/queue/lat-%d?wait=true&timeout=10000&autoAck=true", e.url, q))
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
			}()
		}
		if !waitFor(10*time.Second, func() bool { return e.p.Intentions() >= before+queues }) {
			b.Fatalf("round %d: %d of %d long-polls waiting (before: %d)", round, e.p.Intentions()-before, queues, before)
		}
		pushed := make([]time.Time, queues)
		for q := range queues {
			pushed[q] = time.Now()
			body := fmt.Sprintf(`{"items":[{"queue":"lat-%d","payload":{"round":%d}}]}`, q, round)
			res, err := client.Post(e.url+"/api/v1/push", "application/json", strings.NewReader(body))
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

// idleQueriesPerSecond parks `waiters` long-polls on `queues` empty queues
// and counts the statements sent while they wait.
func idleQueriesPerSecond(b *testing.B, e *env, waiters, queues int, window time.Duration) float64 {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: waiters}}
	defer client.CloseIdleConnections()
	before := e.p.Intentions()
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet,
				fmt.Sprintf("%s/api/v1/pop/queue/idle-%d?wait=true&timeout=300000", e.url, i%queues), nil)
			res, err := client.Do(req)
			if err == nil {
				_ = res.Body.Close()
			}
		}()
	}
	if !waitFor(30*time.Second, func() bool { return e.p.Intentions() >= before+waiters }) {
		b.Fatalf("%d of %d idle long-polls waiting", e.p.Intentions()-before, waiters)
	}
	// Let the registration cycles end: 300 ms without a statement.
	stats := e.store.QueryStats()
	last, quiet := stats.Total(), time.Now()
	waitFor(10*time.Second, func() bool {
		if n := stats.Total(); n != last {
			last, quiet = n, time.Now()
		}
		return time.Since(quiet) >= 300*time.Millisecond
	})
	start, n0 := time.Now(), stats.Total()
	<-time.After(window) // the measured span itself
	q := float64(stats.Total()-n0) / time.Since(start).Seconds()
	cancel()
	wg.Wait()
	return q
}

// benchQueues is how many queues each latency round uses at once.
var benchQueues = 10

// waitFor checks cond every millisecond until it holds (true) or ceiling
// passes (false).
func waitFor(ceiling time.Duration, cond func() bool) bool {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(ceiling)
	for !cond() {
		select {
		case <-deadline:
			return false
		case <-tick.C:
		}
	}
	return true
}
