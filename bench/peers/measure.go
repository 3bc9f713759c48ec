package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/heraldmq/herald/internal/benchstat"
)

// payloadSize is the size of every message body, in bytes.
const payloadSize = 100

// makePayload is message i's body: a benchstat.Stamp of now, padded
// with P to payloadSize bytes of JSON.
func makePayload(i int) []byte {
	s := benchstat.Stamp{T: time.Now().UnixNano(), I: i}
	b, _ := json.Marshal(s)
	if n := payloadSize - len(b) - len(`,"p":""`); n > 0 {
		s.P = strings.Repeat("x", n)
		b, _ = json.Marshal(s)
	}
	return b
}

// sample is one measurement of one system at one rate.
type sample struct {
	P50, P99 float64 // ms
	cpuCost          // per 1,000 messages pushed
	Pushed   int
	Received int
}

// cpuMeter reads the CPU time a system is charged with.
type cpuMeter func() (server, pg time.Duration)

// cpuCost is the CPU a measurement charges a system, in seconds per 1,000
// messages (pushed, delivered: the measurement says which).
type cpuCost struct {
	CPUPer1k  float64 // the server's and, where it has one, its PostgreSQL's
	ServerCPU float64 // the server's part of CPUPer1k
}

// costOf is the cost of what a cpuMeter read before (s0, pg0) and after
// (s1, pg1) a measurement of n messages.
func costOf(s0, pg0, s1, pg1 time.Duration, n float64) cpuCost {
	return cpuCost{CPUPer1k: per1k((s1-s0)+(pg1-pg0), n), ServerCPU: per1k(s1-s0, n)}
}

// per1k is d in seconds per 1,000 of n messages.
func per1k(d time.Duration, n float64) float64 { return d.Seconds() * 1000 / n }

// cost is the cost itself, so that the report reads it from every kind of
// sample that embeds one (costed).
func (c cpuCost) cost() cpuCost { return c }

// costed is a sample with a cpuCost.
type costed interface{ cost() cpuCost }

// cpuOf is the total CPU figure of s (medianOf's and figure's field).
func cpuOf[T costed](s T) float64 { return s.cost().CPUPer1k }

// measure pushes rate messages per second for warm+dur with push, waits for
// all of them to arrive at rec (10 s at most) and reads the CPU spent
// between the first push and the last receipt.
func measure(ctx context.Context, rate int, warm, dur time.Duration, cpu cpuMeter, rec *benchstat.Recorder,
	push func(ctx context.Context, i int, payload []byte) error) (sample, error) {
	total := rec.Total()
	s0, pg0 := cpu()
	pushed, err := pace(ctx, rate, total, push)
	if err != nil {
		return sample{}, err
	}
	select {
	case <-rec.All():
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
		return sample{}, ctx.Err()
	}
	s1, pg1 := cpu()
	l := rec.Latencies()
	out := sample{Pushed: pushed, Received: l.Received, P50: l.Ms(50), P99: l.Ms(99),
		cpuCost: costOf(s0, pg0, s1, pg1, float64(pushed))}
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

// pace calls push total times at rate per second (benchstat.Pace: a
// pool of producers, so that one slow push does not delay the schedule,
// as herald-bench does). The payload is made when the push starts.
func pace(ctx context.Context, rate, total int, push func(ctx context.Context, i int, payload []byte) error) (int, error) {
	sent, err := benchstat.Pace(ctx, rate, total, func(ctx context.Context, i int) error {
		return push(ctx, i, makePayload(i))
	})
	if err != nil && ctx.Err() == nil {
		return sent, fmt.Errorf("pushing: %w", err)
	}
	return sent, err
}
