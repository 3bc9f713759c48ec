package poller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgtest"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type env struct {
	t     testing.TB
	store *queue.Store
	p     *poller.Poller
}

// newEnv runs a poller on a store in a schema of its own; cfg may adjust
// the Config. The poller stops (and Run returns) when the test ends.
func newEnv(t testing.TB, cfg ...func(*poller.Config)) *env {
	t.Helper()
	store := queuetest.NewStore(t)
	c := poller.Config{Store: store}
	for _, f := range cfg {
		f(&c)
	}
	p, err := poller.New(c)
	require.NoError(t, err)
	t.Cleanup(p.Start())
	return &env{t: t, store: store, p: p}
}

// push stores payloads {"n": i} on a partition and wakes the poller, as the
// gateway does after a push.
func (e *env) push(q, part string, from, to int) {
	e.t.Helper()
	var items []queue.PushItem
	for i := from; i <= to; i++ {
		items = append(items, queue.PushItem{Queue: q, Partition: part, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
	}
	_, err := e.store.Push(context.Background(), items)
	require.NoError(e.t, err)
	e.p.Wake(poller.SourcePush, q, part)
}

// receive waits for a waiter's delivery, failing after ceiling.
func receive(t testing.TB, w *poller.Waiter, ceiling time.Duration) *queue.PopResult {
	t.Helper()
	select {
	case res := <-w.C():
		return res
	case <-time.After(ceiling):
		t.Fatalf("no delivery within %v", ceiling)
		return nil
	}
}

// nothing asserts that a waiter gets nothing within d.
func nothing(t testing.TB, w *poller.Waiter, d time.Duration) {
	t.Helper()
	select {
	case res := <-w.C():
		t.Fatalf("unexpected delivery: %d messages", len(res.Messages))
	case <-time.After(d):
	}
}

func ns(res *queue.PopResult) []int {
	var out []int
	for _, m := range res.Messages {
		var v struct{ N int }
		_ = json.Unmarshal(m.Data, &v)
		out = append(out, v.N)
	}
	return out
}

// eventually waits, up to ceiling, for cond to hold (checked every 5 ms).
func eventually(t testing.TB, ceiling time.Duration, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, ceiling, 5*time.Millisecond, msg)
}

// settled waits until the store has sent no statement and the workers ran
// no cycle for 200 ms, with none pending: the cycles that registrations
// and credit started are over. Its ceiling is generous (quietCeiling): a
// poller that keeps itself busy (a timer re-arming itself, a cycle that
// marks its key again) never goes quiet, however long the wait, while a
// cycle starved on a loaded machine does end. If it never goes quiet, the
// failure says what kept it busy: the statements and cycles since it was
// asked and what was pending last.
func (e *env) settled() {
	e.t.Helper()
	stats := e.store.QueryStats()
	first := stats.Snapshot()
	last, runs, quietSince := stats.Total(), e.p.WorkerRuns(), time.Now()
	firstRuns, why := runs, ""
	quiet := func() bool {
		// Quiet: no statement and no cycle for 200 ms, and none to run (a
		// starved machine can leave a cycle signalled but not yet run).
		w := e.p.PendingWhy()
		if n, r := stats.Total(), e.p.WorkerRuns(); n != last || r != runs || w != "" {
			last, runs, quietSince = n, r, time.Now()
			if w != "" {
				why = w
			}
		}
		return time.Since(quietSince) >= 200*time.Millisecond
	}
	deadline := time.Now().Add(quietCeiling)
	for !quiet() {
		if time.Now().After(deadline) {
			e.t.Logf("the workers now:\n%s", workerStacks())
			e.t.Fatalf("the poller went quiet: not within %v; %d cycles and statements %v since it was asked, last pending: %q",
				quietCeiling, e.p.WorkerRuns()-firstRuns, opsBetween(first, stats.Snapshot()), why)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// workerStacks is the stacks of the poller's worker goroutines.
func workerStacks() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "poller.(*worker).run") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// quietCeiling is how long settled waits for the poller to go quiet: the
// one cycle of a registration took 10 s once in a run of the whole suite
// under two CPU hogs (TestHandOff_CreditIsChargedBeforeTheDelivery).
const quietCeiling = 20 * time.Second
