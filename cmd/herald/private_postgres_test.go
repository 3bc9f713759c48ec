package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/client"
)

// healthState is what /health says, with the status code.
type healthState struct {
	code     int
	Status   string `json:"status"`
	Database string `json:"database"`
	Restarts int    `json:"restarts"`
}

func health(hc *http.Client, base string) (healthState, error) {
	res, err := hc.Get(base + "health")
	if err != nil {
		return healthState{}, err
	}
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return healthState{}, err
	}
	h := healthState{code: res.StatusCode}
	if err := json.Unmarshal(b, &h); err != nil {
		return healthState{}, fmt.Errorf("decoding %q: %w", b, err)
	}
	return h, nil
}

// pushRetrying pushes message n until it is answered 201, always under the
// same transaction id, so that a retry of a push that was stored after all
// is answered "duplicate" instead of storing it twice.
func pushRetrying(ctx context.Context, hc *http.Client, base, queue string, n int, retries *atomic.Int64) error {
	body := fmt.Sprintf(`{"items":[{"queue":%q,"transactionId":"pgkill-%d","payload":{"n":%d}}]}`, queue, n, n)
	for try := 0; ; try++ {
		if try > 0 {
			retries.Add(1)
		}
		res, err := hc.Post(base+"api/v1/push", "application/json", strings.NewReader(body))
		if err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
			if res.StatusCode == http.StatusCreated {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pushing message %d: %w", n, ctx.Err())
		case <-time.After(20 * time.Millisecond): // retry back-off
		}
	}
}

// kill -9 of the private PostgreSQL's postmaster under a producer
// and a WebSocket consumer. Herald restarts it, /health reports the restart
// while it happens and after, service is back within 10 s, and every
// message answered 201 is delivered and acknowledged exactly once.
func TestPrivatePostgres_KilledIsRestarted(t *testing.T) {
	bin := buildHerald(t)
	dir := dataDir(t)
	p := startHerald(t, bin, dir)
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	hc := &http.Client{Timeout: 3 * time.Second}

	const queue, total, killAt = "pgkill", 300, 100
	var pushRetries, ackRetries atomic.Int64
	var mu sync.Mutex
	delivered, acked := map[int]int{}, map[int]int{}
	allAcked := make(chan struct{})
	cl, err := client.Dial(ctx, p.url, client.Options{MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	require.NoError(t, err)
	defer func() { _ = cl.Close() }()
	subDone := make(chan error, 1)
	go func() {
		subDone <- cl.Subscribe(ctx, client.SubscribeOptions{Queue: queue, ManualAck: true, MaxInFlight: 10},
			func(ctx context.Context, m *client.Message) error {
				var body struct{ N int }
				if err := json.Unmarshal(m.Data, &body); err != nil {
					return err
				}
				mu.Lock()
				delivered[body.N]++
				mu.Unlock()
				// An ack that fails while the database is down is tried
				// again: the lease is still ours.
				for {
					err := m.Ack(ctx)
					if err == nil {
						break
					}
					if errors.Is(err, client.ErrLeaseLost) || errors.Is(err, client.ErrAckUnknown) {
						return nil // comes again, or was applied: counted by what is acked
					}
					ackRetries.Add(1)
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(50 * time.Millisecond): // retry back-off
					}
				}
				mu.Lock()
				acked[body.N]++
				if len(acked) == total {
					close(allAcked)
				}
				mu.Unlock()
				return nil
			})
	}()

	reached := make(chan struct{})
	produced := make(chan error, 1)
	go func() {
		for n := range total {
			if n == killAt {
				close(reached)
			}
			if err := pushRetrying(ctx, hc, p.url, queue, n, &pushRetries); err != nil {
				produced <- err
				return
			}
		}
		produced <- nil
	}()

	select {
	case <-reached:
	case <-time.After(20 * time.Second):
		t.Fatal("the producer did not reach the kill point")
	}
	pm := postmaster(dir)
	require.True(t, alive(pm), "postmaster %d runs", pm)
	require.NoError(t, syscall.Kill(pm, syscall.SIGKILL))
	killed := time.Now()

	// Watch /health until it is healthy again.
	var sawRestarting bool
	var recovered time.Duration
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for recovered == 0 {
		select {
		case <-tick.C:
		case <-time.After(10*time.Second - time.Since(killed)):
			t.Fatalf("/health not healthy with a restart counted 10 s after the kill (restarting seen: %v)", sawRestarting)
		}
		h, err := health(hc, p.url)
		if err != nil {
			continue // the HTTP server itself stays up; a slow answer is retried
		}
		if h.Database == "restarting" {
			sawRestarting = true
			assert.Equal(t, http.StatusServiceUnavailable, h.code, "restarting is unhealthy")
			assert.Equal(t, "unhealthy", h.Status)
		}
		if h.code == http.StatusOK && h.Restarts >= 1 {
			recovered = time.Since(killed)
			assert.Equal(t, "connected", h.Database)
			assert.Equal(t, 1, h.Restarts)
		}
	}
	t.Logf("time to recover (kill -9 of the postmaster → /health 200): %v", recovered)
	assert.True(t, sawRestarting, `/health said "restarting" while PostgreSQL was being restarted`)
	assert.NotEqual(t, pm, postmaster(dir), "a new postmaster runs")

	select {
	case err := <-produced:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the producer did not finish")
	}
	select {
	case <-allAcked:
	case <-time.After(10 * time.Second):
		mu.Lock()
		var missing []string
		for n := range total {
			if acked[n] == 0 {
				missing = append(missing, fmt.Sprintf("%d (delivered %d times)", n, delivered[n]))
			}
		}
		t.Fatalf("only %d of %d messages acknowledged; not: %s; ack retries %d, push retries %d; herald's warnings:\n%s",
			len(acked), total, strings.Join(missing, ", "), ackRetries.Load(), pushRetries.Load(), p.problemLines())
	}
	cancel()
	require.NoError(t, <-subDone, "the subscription ended by the test, not by an error")
	mu.Lock()
	defer mu.Unlock()
	redelivered := 0
	for n := range total {
		assert.Equal(t, 1, acked[n], "message %d acknowledged once", n)
		require.GreaterOrEqual(t, delivered[n], 1, "message %d delivered", n)
		redelivered += delivered[n] - 1
	}
	assert.Len(t, delivered, total, "nothing delivered that was not pushed")
	t.Logf("%d messages, %d redeliveries, %d pushes and %d acks retried after failing", total, redelivered,
		pushRetries.Load(), ackRetries.Load())

	newPM := postmaster(dir)
	require.NoError(t, p.stop(t, syscall.SIGTERM), "clean exit after the restart")
	gone(t, newPM, "the restarted postmaster is stopped with herald")
}

// A private PostgreSQL that cannot be started again (its files
// are from an incompatible version) is tried five times with back-off,
// then herald exits with status 1, so that its own supervisor acts.
func TestPrivatePostgres_ThatCannotRestartEndsHerald(t *testing.T) {
	bin := buildHerald(t)
	dir := dataDir(t)
	p := startHerald(t, bin, dir, "--drain-window", "0")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "postgres", "pgdata", "PG_VERSION"), []byte("1\n"), 0o600))
	require.NoError(t, syscall.Kill(postmaster(dir), syscall.SIGKILL))
	killed := time.Now()
	hc := &http.Client{Timeout: 3 * time.Second}
	assert.Eventually(t, func() bool {
		h, err := health(hc, p.url)
		return err == nil && h.code == http.StatusServiceUnavailable
	}, 5*time.Second, 10*time.Millisecond, "unhealthy meanwhile")
	select {
	case err := <-p.done:
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit)
		assert.Equal(t, 1, exit.ExitCode())
	case <-time.After(40 * time.Second):
		t.Fatal("herald still runs 40 s after its PostgreSQL became unstartable")
	}
	// Waits of 0.2, 0.4, 0.8, 1.6 and 3.2 s before the five attempts.
	took := time.Since(killed)
	t.Logf("herald exited %v after the kill", took)
	assert.Greater(t, took, 6*time.Second, "it backed off between attempts")
}
