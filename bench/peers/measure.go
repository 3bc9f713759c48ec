package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// payloadSize is the size of every message body, in bytes.
const payloadSize = 100

// stamp is what a message carries: its push time and index, padded with P
// to payloadSize bytes of JSON.
type stamp struct {
	T int64  `json:"t"` // push time, unix ns
	I int    `json:"i"`
	P string `json:"p"`
}

func makePayload(i int) []byte {
	s := stamp{T: time.Now().UnixNano(), I: i}
	b, _ := json.Marshal(s)
	if n := payloadSize - len(b); n > 0 {
		s.P = strings.Repeat("x", n)
		b, _ = json.Marshal(s)
	}
	return b
}

// recorder collects push → receipt latencies, once per message index.
type recorder struct {
	mu      sync.Mutex
	seen    map[int]bool
	samples []time.Duration
	dups    int
	after   int // indexes below are warm-up
	total   int
	all     chan struct{} // closed when total distinct messages arrived
}

func newRecorder(total, warm int) *recorder {
	return &recorder{seen: make(map[int]bool, total), after: warm, total: total, all: make(chan struct{})}
}

func (r *recorder) recordJSON(data []byte, now time.Time) {
	var s stamp
	if json.Unmarshal(data, &s) != nil {
		return
	}
	r.record(s.I, s.T, now)
}

func (r *recorder) record(i int, sent int64, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen[i] {
		r.dups++
		return
	}
	r.seen[i] = true
	if i >= r.after {
		r.samples = append(r.samples, now.Sub(time.Unix(0, sent)))
	}
	if len(r.seen) == r.total {
		close(r.all)
	}
}

// sample is one measurement of one system at one rate.
type sample struct {
	P50, P99  float64 // ms
	CPUPer1k  float64 // seconds of server (+ PostgreSQL) CPU per 1,000 messages
	ServerCPU float64 // the server's part of CPUPer1k
	Pushed    int
	Received  int
}

// cpuMeter reads the CPU time a system is charged with.
type cpuMeter func() (server, pg time.Duration)

// measure pushes rate messages per second for warm+dur with push, waits for
// all of them to arrive at rec (10 s at most) and reads the CPU spent
// between the first push and the last receipt.
func measure(ctx context.Context, rate int, warm, dur time.Duration, cpu cpuMeter, rec *recorder,
	push func(ctx context.Context, i int, payload []byte) error) (sample, error) {
	total := rec.total
	s0, pg0 := cpu()
	pushed, err := pace(ctx, rate, total, push)
	if err != nil {
		return sample{}, err
	}
	select {
	case <-rec.all:
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
		return sample{}, ctx.Err()
	}
	s1, pg1 := cpu()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	sm := rec.samples
	slices.Sort(sm)
	out := sample{Pushed: pushed, Received: len(rec.seen)}
	if len(sm) > 0 {
		out.P50, out.P99 = ms(percentile(sm, 50)), ms(percentile(sm, 99))
	}
	out.ServerCPU = (s1 - s0).Seconds() * 1000 / float64(pushed)
	out.CPUPer1k = ((s1 - s0) + (pg1 - pg0)).Seconds() * 1000 / float64(pushed)
	if out.Received < pushed {
		return out, fmt.Errorf("%d of %d messages arrived within 10 s of the last push", out.Received, pushed)
	}
	return out, nil
}

// runLength is how many messages a measurement pushes and how many of the
// first are warm-up.
func runLength(rate int, warm, dur time.Duration) (total, warmN int) {
	return int(float64(rate) * (warm + dur).Seconds()), int(float64(rate) * warm.Seconds())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(p / 100 * float64(len(sorted)-1))
	return sorted[i]
}

// pace calls push total times at rate per second from a pool of 16
// producers, so that one slow push does not delay the schedule (as
// herald-bench does). The payload is made when the push starts.
func pace(ctx context.Context, rate, total int, push func(ctx context.Context, i int, payload []byte) error) (int, error) {
	jobs := make(chan int, 1024)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range jobs {
				if err := push(ctx, i, makePayload(i)); err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			}
		})
	}
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	timer := time.NewTimer(0)
	defer timer.Stop()
	sent := 0
	for ; sent < total; sent++ {
		if d := time.Until(start.Add(time.Duration(sent) * interval)); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				close(jobs)
				wg.Wait()
				return sent, ctx.Err()
			}
		}
		jobs <- sent
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errc:
		return sent, fmt.Errorf("pushing: %w", err)
	default:
		return sent, nil
	}
}
