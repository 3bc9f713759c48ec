//go:build reliability

package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// careless is a consumer of g1 that does its work (what it acks counts like
// any consumer's) and, around it, sends the acks a careless or hostile client
// sends: acks outside its lease's range, acks naming no lease while
// it holds one, stale acks of deliveries whose lease has ended, with and
// without their old lease id, and one message failed four times in a batch.
// None of them may lose a message, release a lease or dead-letter early:
// the run's verdict checks the first and last, tally the middle.
type careless struct {
	consumer
	pool *pgxpool.Pool // finds the message after a lease's range

	mu    sync.Mutex
	stale []msg // delivered under leases that surely ended (their ids are dead)
	tally map[string]map[string]int
}

// hostileAck is one answer to an ack the careless consumer sent on purpose.
type hostileAck struct {
	Success       bool    `json:"success"`
	Error         *string `json:"error"`
	LeaseReleased bool    `json:"leaseReleased"`
	DLQ           bool    `json:"dlq"`
}

func (c *careless) count(kind string, a hostileAck) {
	what := "accepted"
	switch {
	case a.LeaseReleased:
		what = "released a lease"
	case !a.Success && a.Error != nil:
		what = "refused: " + *a.Error
	}
	c.mu.Lock()
	if c.tally[kind] == nil {
		c.tally[kind] = map[string]int{}
	}
	c.tally[kind][what]++
	c.mu.Unlock()
}

// rawAck posts items to /ack/batch and returns each answer.
func rawAck(ctx context.Context, base, group string, items []map[string]string) ([]hostileAck, error) {
	body, _ := json.Marshal(map[string]any{"consumerGroup": group, "acknowledgments": items})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/ack/batch", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("ack: %d", res.StatusCode)
	}
	var out []hostileAck
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		return nil, err
	}
	if len(out) != len(items) {
		return nil, fmt.Errorf("ack: %d answers to %d items", len(out), len(items))
	}
	return out, nil
}

// nextAfter is the transaction id of the message after m in its partition
// (outside any lease that ends at m), or "" when there is none yet.
func (c *careless) nextAfter(ctx context.Context, m *msg) string {
	var tx string
	_ = c.pool.QueryRow(ctx, `SELECT n.transaction_id FROM messages m
		JOIN messages n ON n.partition_id = m.partition_id AND n.seq > m.seq
		WHERE m.partition_id = $1::uuid AND m.transaction_id = $2 ORDER BY n.seq LIMIT 1`,
		m.PartitionID, m.TransactionID).Scan(&tx)
	return tx
}

// hostile sends the careless acks around one delivered batch, before the
// consumer works through it.
func (c *careless) hostile(ctx context.Context, base string, batch []msg) {
	last := map[string]*msg{} // partition id → the last message leased there
	for i := range batch {
		last[batch[i].PartitionID] = &batch[i]
	}
	var items []map[string]string
	var kinds []string
	add := func(kind string, it map[string]string) {
		it["consumerGroup"] = c.group
		items, kinds = append(items, it), append(kinds, kind)
	}
	for _, m := range last {
		if tx := c.nextAfter(ctx, m); tx != "" {
			add("outside the lease's range", map[string]string{"transactionId": tx, "partitionId": m.PartitionID,
				"leaseId": m.LeaseID, "status": "completed"})
		}
		break
	}
	first := batch[0]
	add("no leaseId under a live lease", map[string]string{"transactionId": first.TransactionID,
		"partitionId": first.PartitionID, "status": []string{"retry", "failed"}[rand.IntN(2)]}) // #nosec G404 -- fault injection
	c.mu.Lock()
	stale := append([]msg(nil), c.stale...)
	c.mu.Unlock()
	rand.Shuffle(len(stale), func(i, j int) { stale[i], stale[j] = stale[j], stale[i] }) // #nosec G404 -- fault injection
	for _, m := range stale[:min(2, len(stale))] {
		add("stale, its old leaseId", map[string]string{"transactionId": m.TransactionID, "partitionId": m.PartitionID,
			"leaseId": m.LeaseID, "status": []string{"completed", "dlq", "failed"}[rand.IntN(3)]}) // #nosec G404 -- fault injection
		add("stale, no leaseId", map[string]string{"transactionId": m.TransactionID, "partitionId": m.PartitionID,
			"status": []string{"retry", "failed"}[rand.IntN(2)]}) // #nosec G404 -- fault injection
	}
	// Each kind in a request of its own: a refused item must not hide in a
	// batch the server applied whole.
	for i, it := range items {
		out, err := rawAck(ctx, base, c.group, []map[string]string{it})
		if err != nil {
			continue // server down: the chaos, not the careless client
		}
		c.count(kinds[i], out[0])
	}
}

// run is a long-poll consumer with the careless acks around each batch. It
// fails one message in ten four times over in one request (and then leaves
// the rest of its batch, whose lease that failure ended).
func (c *careless) run(ctx context.Context, r *record, cl *cluster, home int) {
	for i := home; ctx.Err() == nil; {
		base := cl.insts[i%3].url
		pop, ok := popWait(ctx, base, c.group, 5)
		if !ok {
			i++ // that instance is down or failing: the next, after a pause
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		if len(pop) == 0 {
			continue
		}
		c.hostile(ctx, base, pop)
		if c.work(ctx, r, base, pop) {
			c.mu.Lock()
			c.stale = append(c.stale, pop...)
			if len(c.stale) > 50 {
				c.stale = c.stale[len(c.stale)-50:]
			}
			c.mu.Unlock()
		}
	}
}

// work acks a batch in order, or fails one message in ten four times over in
// one request and leaves the rest (that failure ended the lease). It
// reports whether the lease surely ended, so its id may be used stale.
func (c *careless) work(ctx context.Context, r *record, base string, batch []msg) (ended bool) {
	for k := range batch {
		m := &batch[k]
		if rand.IntN(10) == 0 { // #nosec G404 -- fault injection
			r.delivered(m)
			fail := map[string]string{"transactionId": m.TransactionID, "partitionId": m.PartitionID,
				"leaseId": m.LeaseID, "status": "failed", "consumerGroup": c.group}
			out, err := rawAck(ctx, base, c.group, []map[string]string{fail, fail, fail, fail})
			if err == nil && out[0].Success && !out[0].DLQ {
				// (A failure that dead-letters finishes the message: then
				// the repeats are harmless repeats of a done message.)
				for _, a := range out[1:] {
					c.count("the same failure 4× in one batch (items 2–4)", a)
				}
				ended = true
			}
			for j := k + 1; j < len(batch); j++ {
				r.delivered(&batch[j])
			}
			return ended
		}
		if _, o := c.handle(ctx, r, base, m); o != ackOK {
			for j := k + 1; j < len(batch); j++ {
				r.delivered(&batch[j])
			}
			return false
		}
	}
	return true
}

// verdict lists what the careless acks got, and what no careless ack may
// ever do: release a lease, or be accepted where it names a message outside
// the lease, names no lease under a live one, or repeats a failure. (A stale
// ack may be accepted: as a harmless repeat, when its message is done.)
func (c *careless) verdict() (report string, wrong []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kinds := make([]string, 0, len(c.tally))
	for k := range c.tally {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var b strings.Builder
	for _, k := range kinds {
		fmt.Fprintf(&b, "\n  %s: %v", k, c.tally[k])
		if n := c.tally[k]["released a lease"]; n > 0 {
			wrong = append(wrong, fmt.Sprintf("%s released a lease %d times", k, n))
		}
		if n := c.tally[k]["accepted"]; n > 0 && !strings.HasPrefix(k, "stale") {
			wrong = append(wrong, fmt.Sprintf("%s accepted %d times", k, n))
		}
	}
	return b.String(), wrong
}
