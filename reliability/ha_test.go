//go:build reliability

package reliability

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/internal/server/servertest"
)

// ---- processes of the HA parts (PgBouncer, etcd, Patroni) ----

// asPostgres makes cmd run as the postgres OS user when the test runs as
// root (pgbouncer and initdb refuse root), in a process group of its own
// so that stopping it takes its children too.
func asPostgres(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() != 0 {
		return
	}
	u, err := user.Lookup("postgres")
	require.NoError(t, err, "the postgres OS user (apt-get install postgresql)")
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)} // #nosec G115 -- ids from /etc/passwd
	cmd.Env = append(os.Environ(), "HOME="+cmd.Dir)
}

// postgresDir is a fresh directory the postgres OS user owns.
func postgresDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "herald-ha-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755)) // #nosec G302 -- a test directory the postgres user walks
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		require.NoError(t, err)
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		require.NoError(t, os.Chown(dir, uid, gid))
	}
	return dir
}

// process is a daemon the test started; stop kills its process group.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// startProcess starts name with args as the postgres user, its output in
// dir/<name>.log, and kills it when the test ends.
func startProcess(t *testing.T, dir, name string, args ...string) *process {
	t.Helper()
	log, err := os.Create(filepath.Join(dir, name+".log"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = log.Close() })
	cmd := exec.Command(args[0], args[1:]...) // #nosec G204 -- the test's own daemons
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	asPostgres(t, cmd)
	require.NoError(t, cmd.Start(), "starting %s", name)
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(syscall.SIGKILL) })
	return p
}

// stop sends sig to the process group and waits (10 s at most) for the
// leader to exit.
func (p *process) stop(sig syscall.Signal) {
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// tail is the end of a daemon's log, for a failure's message.
func tail(dir, name string) string {
	b, _ := os.ReadFile(filepath.Join(dir, name+".log")) // #nosec G304 -- the test's own file
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// ---- a numbered flow: one producer, consumers that must see it all ----

// flow pushes numbered messages (payload {"n": n}, transactionId "m-<n>")
// round robin over parts partitions of queue and records what each
// consumer group acked, and when.
type flow struct {
	queue string
	parts int

	mu        sync.Mutex
	pushed    map[int]pushRec                 // n → its push, 201 only
	pushFails int                             // pushes that failed (any error or status)
	failAt    []time.Time                     // when each failed push was answered
	failWhy   map[string]int                  // why, first 60 characters
	acks      map[string]map[int]int          // group → n → successful acks
	order     map[string]map[string][]int     // group → partition → n in ack order
	firstAck  map[string]map[int]time.Time    // group → n → first successful ack
	lastAck   map[string]map[string]time.Time // group → partition → last successful ack
}

type pushRec struct {
	partition     string
	start, answer time.Time
}

func newFlow(queue string, parts int, groups ...string) *flow {
	f := &flow{queue: queue, parts: parts, pushed: map[int]pushRec{}, failWhy: map[string]int{},
		acks: map[string]map[int]int{}, order: map[string]map[string][]int{},
		firstAck: map[string]map[int]time.Time{}, lastAck: map[string]map[string]time.Time{}}
	for _, g := range groups {
		f.acks[g], f.order[g], f.firstAck[g], f.lastAck[g] = map[int]int{}, map[string][]int{},
			map[int]time.Time{}, map[string]time.Time{}
	}
	return f
}

func (f *flow) partition(n int) string { return fmt.Sprintf("p%d", n%f.parts) }

func (f *flow) item(n int) map[string]any {
	return map[string]any{"queue": f.queue, "partition": f.partition(n), "transactionId": fmt.Sprintf("m-%d", n),
		"payload": map[string]int{"n": n}}
}

func (f *flow) fail(why string) {
	if len(why) > 60 {
		why = why[:60]
	}
	f.mu.Lock()
	f.pushFails++
	f.failWhy[why]++
	f.failAt = append(f.failAt, time.Now())
	f.mu.Unlock()
}

func (f *flow) ok(n int, start time.Time) {
	f.mu.Lock()
	f.pushed[n] = pushRec{partition: f.partition(n), start: start, answer: time.Now()}
	f.mu.Unlock()
}

// push sends one message with POST /api/v1/push, or through
// /api/v1/transaction when viaTx; a failed push is tried again with the
// same transactionId (a duplicate answer counts as pushed).
func (f *flow) push(ctx context.Context, base string, n int, viaTx bool) bool {
	start := time.Now()
	var path string
	var body any
	if viaTx {
		path, body = "/api/v1/transaction", map[string]any{"operations": []any{
			map[string]any{"type": "push", "items": []any{f.item(n)}}}}
	} else {
		path, body = "/api/v1/push", map[string]any{"items": []any{f.item(n)}}
	}
	b, _ := json.Marshal(body)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, base+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		f.fail(err.Error())
		return false
	}
	defer func() { _ = res.Body.Close() }()
	var out struct {
		Success *bool `json:"success"`
	}
	_ = json.NewDecoder(res.Body).Decode(&out)
	if (viaTx && (res.StatusCode != http.StatusOK || out.Success == nil || !*out.Success)) ||
		(!viaTx && res.StatusCode != http.StatusCreated) {
		f.fail(fmt.Sprintf("status %d", res.StatusCode))
		return false
	}
	f.ok(n, start)
	return true
}

// produce pushes n = from, from+1, ... below upTo (none: until ctx ends)
// every interval, each until it is pushed (so numbers are pushed in
// order), every other one through a transaction when withTx; it returns
// the next n.
func (f *flow) produce(ctx context.Context, base func() string, from, upTo int, interval time.Duration, withTx bool) int {
	n := from
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for ctx.Err() == nil && (upTo <= 0 || n < upTo) {
		if f.push(ctx, base(), n, withTx && n%2 == 1) {
			n++
		} else {
			sleep(ctx, 50*time.Millisecond)
			continue
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	return n
}

// acked records a successful ack of n by group.
func (f *flow) acked(group, partition string, n int) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acks[group][n]++
	f.order[group][partition] = append(f.order[group][partition], n)
	if _, ok := f.firstAck[group][n]; !ok {
		f.firstAck[group][n] = now
	}
	f.lastAck[group][partition] = now
}

// missing is what group has not acked of what was pushed.
func (f *flow) missing(group string) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int
	for n := range f.pushed {
		if f.acks[group][n] == 0 {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// waitDrained waits up to ceiling for every group to have acked every
// pushed message; it returns what is still missing per group.
func (f *flow) waitDrained(ceiling time.Duration) map[string][]int {
	var left map[string][]int
	servertest.WaitFor(ceiling, nil, func() bool {
		left = map[string][]int{}
		for g := range f.acks {
			if m := f.missing(g); len(m) > 0 {
				left[g] = m
			}
		}
		return len(left) == 0
	})
	return left
}

// verdict lists duplicates (acked more than once) and order breaks (a
// partition's acks not increasing) per group.
func (f *flow) verdict(group string) (dups []int, disorder []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for n, k := range f.acks[group] {
		if k > 1 {
			dups = append(dups, n)
		}
	}
	slices.Sort(dups)
	for p, ns := range f.order[group] {
		for i := 1; i < len(ns); i++ {
			if ns[i] <= ns[i-1] {
				disorder = append(disorder, fmt.Sprintf("%s: %d after %d", p, ns[i], ns[i-1]))
			}
		}
	}
	return dups, disorder
}

// ---- consumers, one per transport, each acking what it gets ----

// wsConsume subscribes with the Go SDK (manual acks) until ctx ends,
// dialling again whenever the client ends.
func (f *flow) wsConsume(ctx context.Context, base func() string, group string) {
	for ctx.Err() == nil {
		cli, err := client.Dial(ctx, base(), client.Options{MaxBackoff: time.Second})
		if err != nil {
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		_ = cli.Subscribe(ctx, client.SubscribeOptions{Queue: f.queue, ConsumerGroup: group, Batch: 10,
			MaxInFlight: 20, ManualAck: true}, func(hctx context.Context, cm *client.Message) error {
			var d struct {
				N int `json:"n"`
			}
			_ = json.Unmarshal(cm.Data, &d)
			if cm.Ack(hctx) == nil {
				f.acked(group, cm.Partition, d.N)
			}
			return nil
		})
		_ = cli.Close()
	}
}

// httpAck acknowledges one message over HTTP, or through
// /api/v1/transaction when viaTx; it reports whether the ack succeeded.
func (f *flow) httpAck(ctx context.Context, base, group string, m *msg, viaTx bool) bool {
	item := map[string]any{"transactionId": m.TransactionID, "partitionId": m.PartitionID, "leaseId": m.LeaseID,
		"consumerGroup": group}
	path, body := "/api/v1/ack", any(item)
	if viaTx {
		item["type"] = "ack"
		path, body = "/api/v1/transaction", map[string]any{"operations": []any{item}}
	}
	b, _ := json.Marshal(body)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, base+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		return false
	}
	if viaTx {
		var out struct {
			Success bool `json:"success"`
		}
		return json.NewDecoder(res.Body).Decode(&out) == nil && out.Success
	}
	var out []struct {
		Success bool `json:"success"`
	}
	return json.NewDecoder(res.Body).Decode(&out) == nil && len(out) == 1 && out[0].Success
}

// longPollConsume pops with wait=true and acks each message, every other
// one through a transaction when withTx.
func (f *flow) longPollConsume(ctx context.Context, base func() string, group string, withTx bool) {
	for ctx.Err() == nil {
		b := base()
		pop, ok := popWaitQueue(ctx, b, f.queue, group, 10)
		if !ok {
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		for i := range pop {
			m := &pop[i]
			if f.httpAck(ctx, b, group, m, withTx && m.Data.N%2 == 0) {
				f.acked(group, m.Partition, m.Data.N)
			}
		}
	}
}

// popWaitQueue is popWait on any queue.
func popWaitQueue(ctx context.Context, base, queue, group string, batch int) ([]msg, bool) {
	url := fmt.Sprintf("%s/api/v1/pop/queue/%s?wait=true&timeout=1000&batch=%d&consumerGroup=%s", base, queue, batch, group)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, false
	}
	defer func() { _ = res.Body.Close() }()
	var pop struct {
		Messages []msg `json:"messages"`
	}
	if res.StatusCode == http.StatusOK {
		_ = json.NewDecoder(res.Body).Decode(&pop)
	}
	return pop.Messages, res.StatusCode < 500
}

// sseConsume reads a stream and acks each event over HTTP; after a
// disconnect it opens a new stream (unacked messages come again when their
// lease ends or the stream's are released).
func (f *flow) sseConsume(ctx context.Context, base func() string, group string) {
	for ctx.Err() == nil {
		b := base()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet,
			fmt.Sprintf("%s/api/v1/sse/queue/%s?consumerGroup=%s&batch=10&maxInFlight=20", b, f.queue, group), nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var data string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "data: "):
				data = strings.TrimPrefix(line, "data: ")
			case line == "" && data != "":
				var m msg
				if json.Unmarshal([]byte(data), &m) == nil && m.TransactionID != "" {
					if f.httpAck(ctx, b, group, &m, false) {
						f.acked(group, m.Partition, m.Data.N)
					}
				}
				data = ""
			}
		}
		_ = res.Body.Close()
		sleep(ctx, 50*time.Millisecond)
	}
}
