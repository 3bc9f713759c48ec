//go:build reliability

package reliability

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/client"
	"github.com/heraldmq/herald/internal/pgtest"
)

const (
	queueName  = "chaos"
	partitions = 20
	retryLimit = 2
	leaseTime  = 4 // seconds: an abandoned batch comes back soon
)

var groups = []string{"g1", "g2"}

// messages is N: HERALD_CHAOS_N, default 20,000 (the short form).
func messages(t *testing.T) int {
	if v := os.Getenv("HERALD_CHAOS_N"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	return 20000
}

// ---- the cluster: three herald processes, syncnet through lossy proxies ----

type instance struct {
	args []string
	url  string
	up   atomic.Bool // started and not stopped: clients pick it (cluster.url)
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// joiners: instances beyond the first three, started and stopped during
// the run, with no --sync-peers: they and the others find each other
// through the members table alone.
const joiners = 2

type cluster struct {
	t     *testing.T
	bin   string
	insts []*instance
}

func buildHerald(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "herald")
	out, err := exec.Command("go", "build", "-o", bin, "../cmd/herald").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

func freePort(t *testing.T, network string) int {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		require.NoError(t, err)
		defer func() { _ = c.Close() }()
		return c.LocalAddr().(*net.UDPAddr).Port
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// lossyProxy forwards datagrams to dst from its own socket, dropping
// drop of them at random; it returns its address and counts what it drops.
func lossyProxy(t *testing.T, dst string, drop float64, dropped *atomic.Int64) string {
	t.Helper()
	in, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	to, err := net.ResolveUDPAddr("udp", dst)
	require.NoError(t, err)
	t.Cleanup(func() { _ = in.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, _, err := in.ReadFrom(buf)
			if err != nil {
				return
			}
			if rand.Float64() < drop { // #nosec G404 -- fault injection
				dropped.Add(1)
				continue
			}
			_, _ = in.WriteTo(buf[:n], to)
		}
	}()
	return in.LocalAddr().String()
}

func newCluster(t *testing.T, dsn string, dropped *atomic.Int64) *cluster {
	c := &cluster{t: t, bin: buildHerald(t)}
	var httpPorts, syncPorts []int
	for range 3 {
		httpPorts = append(httpPorts, freePort(t, "tcp"))
		syncPorts = append(syncPorts, freePort(t, "udp"))
	}
	secret := strings.Repeat("c4", 32)
	for i := range 3 {
		var peers []string
		for j := range 3 {
			if j != i {
				peers = append(peers, lossyProxy(t, fmt.Sprintf("127.0.0.1:%d", syncPorts[j]), 0.3, dropped))
			}
		}
		name := fmt.Sprintf("h%d", i+1)
		in := &instance{url: fmt.Sprintf("http://127.0.0.1:%d", httpPorts[i]), args: []string{"serve",
			"--addr", fmt.Sprintf("127.0.0.1:%d", httpPorts[i]), "--database-url", dsn,
			"--sync-bind", fmt.Sprintf("127.0.0.1:%d", syncPorts[i]), "--sync-peers", strings.Join(peers, ","),
			"--sync-secret", secret, "--server-id", name, "--instance-id", name,
			"--drain-window", "300ms", "--log-level", "error", "--sse-resume-grace", "3s",
			"--retention-interval", "5s"}} // the churned groups are removed during the run
		c.insts = append(c.insts, in)
		c.start(i)
	}
	for i := 3; i < 3+joiners; i++ {
		port := freePort(t, "tcp")
		name := fmt.Sprintf("h%d", i+1)
		c.insts = append(c.insts, &instance{url: fmt.Sprintf("http://127.0.0.1:%d", port), args: []string{"serve",
			"--addr", fmt.Sprintf("127.0.0.1:%d", port), "--database-url", dsn,
			"--sync-bind", fmt.Sprintf("127.0.0.1:%d", freePort(t, "udp")),
			"--sync-secret", secret, "--server-id", name, "--instance-id", name,
			"--drain-window", "300ms", "--log-level", "error", "--sse-resume-grace", "3s"}})
	}
	t.Cleanup(func() {
		for _, in := range c.insts {
			in.mu.Lock()
			if in.cmd != nil {
				_ = in.cmd.Process.Kill()
			}
			in.mu.Unlock()
		}
	})
	return c
}

func (c *cluster) start(i int) {
	in := c.insts[i]
	cmd := exec.Command(c.bin, in.args...)
	cmd.Stderr = os.Stderr
	require.NoError(c.t, cmd.Start())
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	in.mu.Lock()
	in.cmd, in.done = cmd, done
	in.mu.Unlock()
	require.Eventually(c.t, func() bool {
		res, err := http.Get(in.url + "/health")
		if err != nil {
			return false
		}
		_ = res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, time.Minute, 20*time.Millisecond, "instance %d starts", i+1)
	in.up.Store(true)
}

// url is the address of the first instance up from the i-th on (modulo
// all of them): clients move on to the next when one fails.
func (c *cluster) url(i int) string {
	for k := range len(c.insts) {
		if in := c.insts[(i+k)%len(c.insts)]; in.up.Load() {
			return in.url
		}
	}
	return c.insts[i%3].url
}

// stop sends SIGTERM and waits: the instance drains, gives its leases
// back and deletes its members row.
func (c *cluster) stop(i int) {
	in := c.insts[i]
	in.up.Store(false)
	in.mu.Lock()
	cmd, done := in.cmd, in.done
	in.cmd = nil
	in.mu.Unlock()
	require.NoError(c.t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		c.t.Fatalf("instance %d did not stop within 30 s of SIGTERM", i+1)
	}
}

// peersAlive reads herald_syncnet_peers_alive from an instance's metrics.
func (c *cluster) peersAlive(i int) int {
	res, err := http.Get(c.insts[i].url + "/metrics")
	if err != nil {
		return -1
	}
	defer func() { _ = res.Body.Close() }()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "herald_syncnet_peers_alive "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return int(f)
		}
	}
	return -1
}

// waitUnhealthy waits, while PostgreSQL is down, until an instance's
// /health says so (503): the instances have met the outage. Ceiling 10 s.
func (c *cluster) waitUnhealthy() {
	require.Eventually(c.t, func() bool {
		for _, in := range c.insts {
			res, err := http.Get(in.url + "/health")
			if err != nil {
				continue
			}
			_ = res.Body.Close()
			if res.StatusCode == http.StatusServiceUnavailable {
				return true
			}
		}
		return false
	}, 10*time.Second, 50*time.Millisecond, "an instance reports PostgreSQL down")
}

// kill sends SIGKILL: no drain, no lease given back.
func (c *cluster) kill(i int) {
	in := c.insts[i]
	in.up.Store(false)
	in.mu.Lock()
	cmd, done := in.cmd, in.done
	in.cmd = nil
	in.mu.Unlock()
	require.NoError(c.t, cmd.Process.Kill())
	<-done
}

// ---- what the consumers saw ----

type msg struct {
	TransactionID string    `json:"transactionId"`
	PartitionID   string    `json:"partitionId"`
	LeaseID       string    `json:"leaseId"`
	Partition     string    `json:"partition"`
	ConsumerGroup string    `json:"consumerGroup"`
	Offset        int64     `json:"offset"`
	CreatedAt     time.Time `json:"createdAt"`
	RetryCount    int       `json:"retryCount"`
	Data          struct {
		N int `json:"n"`
	} `json:"data"`
	got time.Time // when the consumer got it
}

type ackEvent struct {
	seq    int64
	offset int64
	tx     string
	lease  string
}

// misorderedAcks are the successful acks of one partition that the
// client got answered out of push order: each pair is an ack and the one
// answered before it with a higher offset. Acks left out (leftOut) are not
// compared: an ack under a lease that had run out, and the acks of a
// message whose earlier ack had an unknown outcome (a database restart
// cut it off): its consumer went on to the next message, whose ack took,
// and the message came again later, as at-least-once delivery has it.
func misorderedAcks(evs []ackEvent, offsets map[string]int64, leftOut func(ackEvent) bool) [][2]ackEvent {
	evs = slices.DeleteFunc(slices.Clone(evs), leftOut)
	slices.SortFunc(evs, func(a, b ackEvent) int { return int(a.seq - b.seq) })
	for i := range evs {
		evs[i].offset = offsets[evs[i].tx]
	}
	var out [][2]ackEvent
	for i := 1; i < len(evs); i++ {
		if evs[i].offset <= evs[i-1].offset {
			out = append(out, [2]ackEvent{evs[i-1], evs[i]})
		}
	}
	return out
}

// okAck is a delivery whose ack succeeded: under which lease, and when the
// consumer got it.
type okAck struct {
	lease string
	got   time.Time
}

// afterLeaseEnded says whether every delivery of a message acked more than
// once came after the lease of the one before it had run out: at least
// once allows that (a consumer's ack answered late, on a loaded machine or
// across a database restart, reaches the server after another consumer was
// given the message again and acked it; an ack of a message done answers
// success). Two acks under one lease are never allowed.
//
// A lease's time starts when it is taken and again whenever the server
// renews it: a push handing it more messages (an extension, or a following
// lease with less than half its time left) and an ack under a following
// lease. Each of these is seen by a consumer after the server did it (a
// delivery under the lease, an ack's answer: renewals, per lease), so a
// lease ends at the latest leaseTime after the last of them, or after the
// time in its id (a UUIDv7 the server makes before the statement that takes
// it) when none was seen. One seen only after the next delivery may have
// been made by the server just before it: then the lease may have lasted
// until leaseTime after that delivery, which is not allowed.
func afterLeaseEnded(oks []okAck, renewals map[string][]time.Time) bool {
	if len(oks) < 2 {
		return false
	}
	oks = byGot(oks)
	for i := 1; i < len(oks); i++ {
		end, ok := leaseEndBound(oks[i-1].lease, renewals, oks[i].got)
		if !ok || oks[i].lease == oks[i-1].lease || oks[i].got.Before(end) {
			return false
		}
	}
	return true
}

// leaseEndBound is the latest a lease can have run out, as seen from a
// delivery at next (afterLeaseEnded): leaseTime after its id's time or the
// last of its renewals, one seen after next counting as next.
func leaseEndBound(lease string, renewals map[string][]time.Time, next time.Time) (time.Time, bool) {
	last, ok := uuidTime(lease)
	if !ok {
		return time.Time{}, false
	}
	for _, at := range renewals[lease] {
		if at.After(next) {
			at = next
		}
		if at.After(last) {
			last = at
		}
	}
	return last.Add(leaseTime * time.Second), true
}

// byGot is a copy of oks in the order their consumers got them.
func byGot(oks []okAck) []okAck {
	return slices.SortedFunc(slices.Values(oks), func(a, b okAck) int { return a.got.Compare(b.got) })
}

// uuidTime is the creation time in a UUIDv7 (its first 48 bits, in
// milliseconds since the epoch).
func uuidTime(id string) (time.Time, bool) {
	h := strings.ReplaceAll(id, "-", "")
	if len(h) != 32 || h[12] != '7' {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(h[:12], 16, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

type record struct {
	seq        atomic.Int64
	mu         sync.Mutex
	acked      map[string]map[string]int        // group → txid → acks that succeeded
	oks        map[string]map[string][]okAck    // group → txid → the deliveries whose acks succeeded
	uncertain  map[string]map[string]bool       // group → txid → an ack whose outcome is unknown
	order      map[string]map[string][]ackEvent // group → partition → successful acks
	failed     map[string]map[string]int        // group → txid → failed on purpose
	deliveries int
	worst      time.Duration
	unknownWhy map[string]int      // why an ack's outcome is unknown
	trail      map[string][]string // group/txid → what happened, for a failure's report; nil: not kept
	// seen: group/lease → what a consumer saw under the lease that the
	// server may have renewed it with (renewalsOf): each delivery (tx "")
	// and each ack answered with success or not answered.
	seen map[string][]leaseEvent
}

// leaseEvent is a delivery under a lease (tx "") or an ack of tx under it,
// at the time a consumer saw it.
type leaseEvent struct {
	tx string
	at time.Time
}

// renewalsOf gives, per lease of group, the times a consumer saw what may
// have renewed it: every delivery under it, and every ack under it but
// those of a message delivered again later (by got) under another lease and
// acked there: such an ack reached the server after the lease had ended
// (had it come while the lease held the message, the message would have
// been done and never delivered again), so it renewed nothing. Called with
// r.mu.
func (r *record) renewalsOf(group string) map[string][]time.Time {
	out := map[string][]time.Time{}
	for k, evs := range r.seen {
		g, lease, _ := strings.Cut(k, "/")
		if g != group {
			continue
		}
		for _, ev := range evs {
			if ev.tx != "" {
				if oks := byGot(r.oks[group][ev.tx]); len(oks) > 0 && oks[len(oks)-1].lease != lease {
					continue
				}
			}
			out[lease] = append(out[lease], ev.at)
		}
	}
	return out
}

// sawUnder notes an event a consumer of group saw under lease (renewalsOf).
// Called with r.mu.
func (r *record) sawUnder(group, lease, tx string, at time.Time) {
	if lease == "" {
		return // autoAck: no lease
	}
	r.seen[group+"/"+lease] = append(r.seen[group+"/"+lease], leaseEvent{tx, at})
}

// trailMax: above this many messages the per-message trail is not kept (a
// million messages' trail would take gigabytes).
const trailMax = 100000

func (r *record) note(group, tx, what string) {
	if r.trail == nil {
		return
	}
	r.mu.Lock()
	r.trail[group+"/"+tx] = append(r.trail[group+"/"+tx], what)
	r.mu.Unlock()
}

func newRecord(n int) *record {
	r := &record{acked: map[string]map[string]int{}, oks: map[string]map[string][]okAck{}, uncertain: map[string]map[string]bool{},
		order: map[string]map[string][]ackEvent{}, failed: map[string]map[string]int{}, unknownWhy: map[string]int{},
		seen: map[string][]leaseEvent{}}
	if n <= trailMax {
		r.trail = map[string][]string{}
	}
	for _, g := range groups {
		r.acked[g], r.oks[g], r.uncertain[g], r.order[g], r.failed[g] = map[string]int{}, map[string][]okAck{},
			map[string]bool{}, map[string][]ackEvent{}, map[string]int{}
	}
	return r
}

func (r *record) delivered(m *msg) {
	m.got = time.Now()
	r.note(m.ConsumerGroup, m.TransactionID, fmt.Sprintf("%s delivered(retry=%d lease=%s)", m.got.Format("15:04:05.000"), m.RetryCount, m.LeaseID))
	lat := time.Since(m.CreatedAt)
	r.mu.Lock()
	r.deliveries++
	r.sawUnder(m.ConsumerGroup, m.LeaseID, "", m.got)
	if lat > r.worst {
		r.worst = lat
	}
	r.mu.Unlock()
}

// outcome of an ack.
type outcome int

const (
	ackOK outcome = iota
	ackRefused
	ackUnknown
)

func (r *record) settled(group string, m *msg, seq int64, o outcome) {
	r.note(group, m.TransactionID, fmt.Sprintf("ack#%d:%s lease=%s", seq, [...]string{"ok", "refused", "unknown"}[o], m.LeaseID))
	at := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if o != ackRefused {
		r.sawUnder(group, m.LeaseID, m.TransactionID, at)
	}
	switch o {
	case ackOK:
		r.acked[group][m.TransactionID]++
		r.oks[group][m.TransactionID] = append(r.oks[group][m.TransactionID], okAck{m.LeaseID, m.got})
		r.order[group][m.Partition] = append(r.order[group][m.Partition], ackEvent{seq, m.Offset, m.TransactionID, m.LeaseID})
	case ackUnknown:
		r.uncertain[group][m.TransactionID] = true
	}
}

func (r *record) why(transport string, err error) {
	msg := err.Error()
	if len(msg) > 60 {
		msg = msg[:60]
	}
	r.mu.Lock()
	r.unknownWhy[transport+": "+msg]++
	r.mu.Unlock()
}

func (r *record) failedOnPurpose(group string, m *msg) {
	r.note(group, m.TransactionID, "failed")
	r.mu.Lock()
	r.failed[group][m.TransactionID]++
	r.mu.Unlock()
}

// ---- consumers ----

// consumer is one of the suite's consumers; chaos asks it to drop its
// connection in the middle of a batch.
type consumer struct {
	name       string
	group      string
	failFifth  bool // fails every message whose n is a multiple of 5
	disconnect atomic.Bool
}

func httpAck(ctx context.Context, base string, group string, items []map[string]string) ([]bool, error) {
	var body []byte
	for _, it := range items {
		it["consumerGroup"] = group
	}
	body, _ = json.Marshal(map[string]any{"consumerGroup": group, "acknowledgments": items})
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
		b, _ := io.ReadAll(res.Body)
		return nil, fmt.Errorf("ack: %d %s", res.StatusCode, b)
	}
	var out []struct {
		Success bool `json:"success"`
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		return nil, err
	}
	ok := make([]bool, len(out))
	for i, o := range out {
		ok[i] = o.Success
	}
	return ok, nil
}

// ackHTTP acks (or fails) one message over HTTP and records the outcome.
func (c *consumer) ackHTTP(ctx context.Context, r *record, base string, m *msg, status string) outcome {
	seq := r.seq.Add(1)
	ok, err := httpAck(ctx, base, c.group, []map[string]string{{"transactionId": m.TransactionID,
		"partitionId": m.PartitionID, "leaseId": m.LeaseID, "status": status}})
	var opErr *net.OpError
	o := ackRefused
	switch {
	case status != "completed":
		return ackRefused
	case err != nil && errors.As(err, &opErr) && opErr.Op == "dial":
		// never reached a server
	case err != nil:
		r.why("http", err)
		o = ackUnknown
	case len(ok) == 1 && ok[0]:
		o = ackOK
	}
	r.settled(c.group, m, seq, o)
	return o
}

// handle processes one message: fail it on purpose, or ack it.
func (c *consumer) handle(ctx context.Context, r *record, base string, m *msg) (stop bool, o outcome) {
	r.note(c.group, m.TransactionID, c.name+"@"+time.Now().Format("15:04:05.000"))
	r.delivered(m)
	if c.failFifth && m.Data.N%5 == 0 {
		r.failedOnPurpose(c.group, m)
		c.ackHTTP(ctx, r, base, m, "failed")
		return true, ackRefused // a failed ack ends the lease: the rest of the batch comes again
	}
	return false, c.ackHTTP(ctx, r, base, m, "completed")
}

// popWait long-polls one instance for up to batch messages of group (1 s
// wait). ok is false when the instance could not be reached or failed
// (5xx); an empty answer is ok.
func popWait(ctx context.Context, base, group string, batch int) (msgs []msg, ok bool) {
	url := fmt.Sprintf("%s/api/v1/pop/queue/%s?wait=true&timeout=1000&batch=%d&consumerGroup=%s", base, queueName, batch, group)
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

// longPoll pops with wait=true and acks each message over HTTP. A
// disconnect abandons the rest of the batch (its lease expires).
func (c *consumer) longPoll(ctx context.Context, r *record, cl *cluster, home int) {
	for i := home; ctx.Err() == nil; {
		base := cl.url(i)
		pop, ok := popWait(ctx, base, c.group, 10)
		if !ok {
			i++ // that instance is down or failing: the next, after a pause
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		for k := range pop {
			if k == len(pop)/2 && c.disconnect.CompareAndSwap(true, false) {
				for j := k; j < len(pop); j++ {
					r.delivered(&pop[j])
				}
				break // abandoned mid-batch
			}
			if stop, _ := c.handle(ctx, r, base, &pop[k]); stop {
				for j := k + 1; j < len(pop); j++ {
					r.delivered(&pop[j])
				}
				break
			}
		}
	}
}

// sse reads a stream, acks each event over HTTP, and resumes with
// Last-Event-ID after a disconnect (the instance it reaches acks what the
// token covers).
func (c *consumer) sse(ctx context.Context, r *record, cl *cluster, home int) {
	lastID := ""
	var unsettled []*msg // received, not surely acked: a resume may ack them
	for i := home; ctx.Err() == nil; i++ {
		base := cl.url(i)
		sctx, cancel := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(sctx, http.MethodGet,
			fmt.Sprintf("%s/api/v1/sse/queue/%s?consumerGroup=%s&batch=10&maxInFlight=20", base, queueName, c.group), nil)
		if lastID != "" {
			// The instance it reaches acks everything up to the token
			// (if the leases are still held): what was received and not
			// surely acked may be done now.
			req.Header.Set("Last-Event-ID", lastID)
			for _, m := range unsettled {
				r.settled(c.group, m, r.seq.Add(1), ackUnknown)
			}
			unsettled = nil
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var id, data string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id: "):
				id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				data = strings.TrimPrefix(line, "data: ")
			case line == "" && data != "":
				var m msg
				if json.Unmarshal([]byte(data), &m) == nil {
					if _, o := c.handle(ctx, r, base, &m); o != ackOK {
						unsettled = append(unsettled, &m)
					}
					lastID = id
				}
				data = ""
				if c.disconnect.CompareAndSwap(true, false) {
					cancel() // mid-stream: the rest of what it holds comes again
				}
			}
		}
		_ = res.Body.Close()
		cancel()
		sleep(ctx, 50*time.Millisecond)
	}
}

// ws consumes with the Go SDK (manual acks); a disconnect closes the
// client in the middle of a delivery and dials again.
func (c *consumer) ws(ctx context.Context, r *record, cl *cluster, home int) {
	for i := home; ctx.Err() == nil; i++ {
		base := cl.url(i)
		wctx, cancel := context.WithCancel(ctx)
		cli, err := client.Dial(wctx, base, client.Options{MaxBackoff: time.Second})
		if err != nil {
			cancel()
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		_ = cli.Subscribe(wctx, client.SubscribeOptions{Queue: queueName, ConsumerGroup: c.group, Batch: 10,
			MaxInFlight: 20, ManualAck: true}, func(hctx context.Context, cm *client.Message) error {
			m := msg{TransactionID: cm.TransactionID, PartitionID: cm.PartitionID, LeaseID: cm.LeaseID, ConsumerGroup: c.group,
				Partition: cm.Partition, Offset: cm.Offset, CreatedAt: cm.CreatedAt, RetryCount: cm.RetryCount}
			_ = json.Unmarshal(cm.Data, &m.Data)
			r.note(c.group, m.TransactionID, c.name+"@"+time.Now().Format("15:04:05.000"))
			r.delivered(&m)
			if c.disconnect.CompareAndSwap(true, false) {
				cancel() // this message and the rest of the delivery come again
				return nil
			}
			seq := r.seq.Add(1)
			err := cm.Ack(hctx)
			switch {
			case err == nil:
				r.settled(c.group, &m, seq, ackOK)
			case errors.Is(err, client.ErrLeaseLost):
				r.settled(c.group, &m, seq, ackRefused)
			default:
				r.why("ws", err)
				r.settled(c.group, &m, seq, ackUnknown)
			}
			return nil
		})
		_ = cli.Close()
		cancel()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// ---- the run ----

// The verdict's one allowance for a message acked twice: delivered again
// only after the lease it was first delivered under had run out, counted
// from the last time the server may have renewed that lease as its
// consumers saw it (a delivery under it, an ack's answer), not only from
// the time the lease was taken.
func TestChaosVerdict_AckedAgainOnlyAfterTheLeaseRanOut(t *testing.T) {
	made := time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)
	lease := func(at time.Time, tail string) string {
		h := fmt.Sprintf("%012x", at.UnixMilli())
		return h[:8] + "-" + h[8:] + "-7abc-8def-" + tail
	}
	a, b := lease(made, "00000000000a"), lease(made.Add(leaseTime*time.Second), "00000000000b")
	ran := made.Add(leaseTime * time.Second)
	got := made.Add(time.Millisecond) // a's delivery reached its consumer
	seenA := map[string][]time.Time{a: {got}}
	for _, c := range []struct {
		name     string
		oks      []okAck
		renewals map[string][]time.Time
		want     bool
	}{
		{"once", []okAck{{a, got}}, seenA, false},
		{"again after the lease ran out", []okAck{{a, got}, {b, ran.Add(time.Millisecond)}}, seenA, true},
		{"answered in either order", []okAck{{b, ran.Add(time.Second)}, {a, got}}, seenA, true},
		{"again while the lease was live", []okAck{{a, got}, {b, ran.Add(-time.Millisecond)}}, seenA, false},
		{"twice under one lease", []okAck{{a, got}, {a, ran.Add(time.Second)}}, seenA, false},
		{"a lease id that says no time", []okAck{{"not-a-uuid", got}, {b, ran.Add(time.Hour)}}, nil, false},
		{"again before leaseTime after the lease's delivery", []okAck{{a, got}, {b, ran}}, seenA, false},
		{"again before leaseTime after a renewal of the lease (an ack's answer, a later push's delivery)",
			[]okAck{{a, got}, {b, ran.Add(time.Second)}}, map[string][]time.Time{a: {got, made.Add(2 * time.Second)}}, false},
		{"again after leaseTime after the last renewal", []okAck{{a, got}, {b, ran.Add(2 * time.Second)}},
			map[string][]time.Time{a: {got, made.Add(2 * time.Second)}}, true},
		{"a renewal seen only after the next delivery", []okAck{{a, got}, {b, ran.Add(time.Minute)}},
			map[string][]time.Time{a: {got, ran.Add(2 * time.Minute)}}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, afterLeaseEnded(c.oks, c.renewals))
		})
	}
}

// An ack under a lease of a message delivered again later under another
// lease and acked there renewed nothing (it reached the server after the
// lease ended); every other ack and every delivery under a lease may have.
func TestChaosVerdict_RenewalsLeaveOutAcksOfAMessageDeliveredAgain(t *testing.T) {
	r := newRecord(10)
	t0 := time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, d := range []struct {
		lease, tx string
		got, ack  int
	}{
		{"A", "m1", 0, 10},   // acked under A while A held it
		{"A", "m2", 1, 6000}, // answered late: m2 came again under B
		{"B", "m2", 5000, 5010},
	} {
		r.oks["g1"][d.tx] = append(r.oks["g1"][d.tx], okAck{d.lease, at(d.got)})
		r.sawUnder("g1", d.lease, "", at(d.got))
		r.sawUnder("g1", d.lease, d.tx, at(d.ack))
	}
	got := r.renewalsOf("g1")
	assert.Equal(t, []time.Time{at(0), at(10), at(1)}, got["A"], "A's deliveries and its ack of m1, not of m2")
	assert.Equal(t, []time.Time{at(5000), at(5010)}, got["B"])
}

// The order verdict compares the acks that took, in the order they were
// answered: out of push order is a failure, unless the earlier message's
// first ack had an unknown outcome (its consumer went on; the message came
// again under a new lease) or its lease had run out.
func TestChaosVerdict_AcksOutOfPushOrderFailUnlessAnEarlierAcksOutcomeWasUnknown(t *testing.T) {
	offsets := map[string]int64{"m1": 1, "m2": 2}
	inOrder := []ackEvent{{seq: 1, tx: "m1", lease: "A"}, {seq: 2, tx: "m2", lease: "A"}}
	// m1's ack under A (seq 1) was cut off; m2's took; m1 came again
	// under B and its ack took after m2's.
	again := []ackEvent{{seq: 2, tx: "m2", lease: "A"}, {seq: 3, tx: "m1", lease: "B"}}
	none := func(ackEvent) bool { return false }
	assert.Empty(t, misorderedAcks(inOrder, offsets, none))
	assert.Len(t, misorderedAcks(again, offsets, none), 1, "out of push order")
	assert.Empty(t, misorderedAcks(again, offsets, func(e ackEvent) bool { return e.tx == "m1" }),
		"m1's first ack had an unknown outcome")
	assert.Len(t, misorderedAcks(again, offsets, func(e ackEvent) bool { return e.tx == "m3" }), 1,
		"another message's unknown outcome excuses nothing")
}

func TestChaos(t *testing.T) {
	n := messages(t)
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	var dropped atomic.Int64
	cl := newCluster(t, dsn, &dropped)
	status, body := post(t, cl.insts[0].url+"/api/v1/configure", fmt.Sprintf(
		`{"queue":%q,"options":{"leaseTime":%d,"retryLimit":%d,"deadLetterQueue":true}}`, queueName, leaseTime, retryLimit))
	require.Equal(t, http.StatusOK, status, body)

	r := newRecord(n)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var consumers []*consumer
	for gi, g := range groups {
		for ti, transport := range []string{"ws", "sse", "longpoll"} {
			c := &consumer{name: g + "-" + transport, group: g, failFifth: g == "g2" && transport == "longpoll"}
			consumers = append(consumers, c)
			home := gi + ti
			switch transport {
			case "ws":
				wg.Go(func() { c.ws(runCtx, r, cl, home) })
			case "sse":
				wg.Go(func() { c.sse(runCtx, r, cl, home) })
			default:
				wg.Go(func() { c.longPoll(runCtx, r, cl, home) })
			}
		}
	}

	// The careless client: a consumer of g1 that also sends stale acks,
	// acks outside its lease, acks without lease ids and repeated items.
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	reckless := &careless{consumer: consumer{name: "g1-careless", group: "g1"}, pool: pool, tally: map[string]map[string]int{}}
	wg.Go(func() { reckless.run(runCtx, r, cl, 2) })

	// Group churn: browser tabs each in a group of its own come, read a
	// little (some over a WebSocket, some by HTTP pops that leave their
	// lease unacked) and go; their groups are then aged past the queue's
	// idle time, for retention to remove while everything else runs.
	churn := &groupChurn{pool: pool}
	wg.Go(func() { churn.run(runCtx, cl) })

	// Producers: unique transactionIds, 20 partitions, through every
	// instance in turn; a batch that fails is pushed again (duplicates are
	// recognised by transactionId).
	start := time.Now()
	var pushed atomic.Int64
	var pwg sync.WaitGroup
	const producers = 2
	for p := range producers {
		pwg.Go(func() {
			for lo := p * 100; lo < n; lo += producers * 100 {
				var items []map[string]any
				for k := lo; k < min(lo+100, n); k++ {
					items = append(items, map[string]any{"queue": queueName, "partition": fmt.Sprintf("p%02d", k%partitions),
						"transactionId": fmt.Sprintf("m-%07d", k), "payload": map[string]int{"n": k}})
				}
				body, _ := json.Marshal(map[string]any{"items": items})
				for try := 0; ; try++ {
					status, _ := postBytes(cl.url(lo/100+try)+"/api/v1/push", body)
					if status == http.StatusCreated {
						pushed.Add(int64(len(items)))
						break
					}
					sleep(ctx, 100*time.Millisecond)
				}
			}
		})
	}

	// Faults, on the test's goroutine (pgtest.Restart may fail the test).
	faults := time.NewTicker(1500 * time.Millisecond)
	defer faults.Stop()
	db := func() *pgx.Conn {
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		return conn
	}
	done := false
	deadline := time.Now().Add(time.Duration(max(3, n/2000)) * time.Minute)
	step := 0
	var restarts, pgRestarts, disconnects, joins, leaves int
	for !done {
		<-faults.C
		step++
		// Every minute (40 steps): kill -9 an instance, start it again,
		// then restart PostgreSQL.
		switch step % 40 {
		case 3:
			cl.kill(restarts % 3)
			restarts++
		case 5:
			cl.start((restarts - 1) % 3)
		case 8:
			pgtest.Restart(t, func() { cl.waitUnhealthy() })
			pgRestarts++
		case 10, 11:
			// A joiner starts: no --sync-peers, the members table tells it
			// and the others. It counts the three first alive (and the
			// other joiner when up) within 5 s.
			j := 3 + step%40 - 10
			cl.start(j)
			joins++
			require.Eventually(t, func() bool { return cl.peersAlive(j) >= 3 }, 5*time.Second, 50*time.Millisecond,
				"joiner h%d finds the others through the members table", j+1)
		case 16:
			cl.stop(3) // cleanly: drains, gives back its leases, deletes its row
			leaves++
		case 19:
			cl.kill(4) // its leases expire, its row ages out
			leaves++
		}
		if step%2 == 0 {
			c := consumers[rand.IntN(len(consumers))] // #nosec G404 -- fault injection
			c.disconnect.Store(true)
			disconnects++
		}
		if step%10 == 0 {
			conn := db()
			rows, err := conn.Query(ctx, `SELECT c.consumer_group, sum(p.last_offset - c.cursor - cardinality(c.done)),
				count(*) FILTER (WHERE c.lease_expires_at > now()), count(*)
				FROM consumers c JOIN partitions p ON p.id = c.partition_id GROUP BY 1 ORDER BY 1`)
			require.NoError(t, err)
			var progress []string
			for rows.Next() {
				var g string
				var lag, leased, parts int64
				require.NoError(t, rows.Scan(&g, &lag, &leased, &parts))
				progress = append(progress, fmt.Sprintf("%s lag %d (%d of %d partitions leased)", g, lag, leased, parts))
			}
			_ = conn.Close(ctx)
			r.mu.Lock()
			deliveries := r.deliveries
			r.mu.Unlock()
			t.Logf("%v: pushed %d, %d deliveries; %s", time.Since(start).Round(time.Second), pushed.Load(), deliveries,
				strings.Join(progress, "; "))
		}
		if pushed.Load() == int64(n) && step > 19 { // the joiners came and went

			conn := db()
			done = finished(t, conn, n)
			_ = conn.Close(ctx)
		}
		require.True(t, time.Now().Before(deadline), "not finished in time: pushed %d of %d", pushed.Load(), n)
	}
	took := time.Since(start)
	pwg.Wait()
	stop()
	wg.Wait()
	churn.verify(t, ctx, dsn)

	// ---- the verdict ----
	conn := db()
	defer func() { _ = conn.Close(ctx) }()
	dlq := map[string]map[string]int{} // group → txid → retry_count
	for _, g := range groups {
		dlq[g] = map[string]int{}
	}
	rows, err := conn.Query(ctx, `SELECT consumer_group, transaction_id, retry_count FROM dead_letters`)
	require.NoError(t, err)
	for rows.Next() {
		var g, tx string
		var rc int
		require.NoError(t, rows.Scan(&g, &tx, &rc))
		if dlq[g] == nil {
			continue // a churned group's (none is expected: they never pop again)
		}
		dlq[g][tx] = rc
	}
	require.NoError(t, rows.Err())

	// Offsets from the database (a long-poll's pop shape has none).
	offsets := map[string]int64{}
	rows, err = conn.Query(ctx, `SELECT m.transaction_id, m.seq FROM messages m JOIN partitions p ON p.id = m.partition_id
		JOIN queues q ON q.id = p.queue_id WHERE q.name = $1`, queueName)
	require.NoError(t, err)
	for rows.Next() {
		var tx string
		var seq int64
		require.NoError(t, rows.Scan(&tx, &seq))
		offsets[tx] = seq
	}
	require.NoError(t, rows.Err())
	require.Len(t, offsets, n, "every message stored once")

	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range groups {
		twice, late, missing, dlqAndAcked, earlyDLQ := 0, 0, 0, 0, 0
		lateLeases := map[string]bool{} // txid + lease: a late ack, left out of the order check
		renewals := r.renewalsOf(g)
		for k := range n {
			tx := fmt.Sprintf("m-%07d", k)
			acks := r.acked[g][tx]
			_, inDLQ := dlq[g][tx]
			switch {
			case acks > 1 && afterLeaseEnded(r.oks[g][tx], renewals):
				// At least once: delivered again after its lease ran out,
				// while the first consumer's ack was still on its way; that
				// ack's success is the idempotent answer for a message done.
				late++
				oks := byGot(r.oks[g][tx])
				if late <= 3 {
					var ends []string
					for i, a := range oks[:len(oks)-1] {
						end, _ := leaseEndBound(a.lease, renewals, oks[i+1].got)
						ends = append(ends, fmt.Sprintf("%s ran out by %s (%d renewals seen)", a.lease,
							end.Format("15:04:05.000"), len(renewals[a.lease])))
					}
					t.Logf("%s/%s acked again after its lease ran out (allowed): %v; %v", g, tx, ends, r.trail[g+"/"+tx])
				}
				// The acks under the leases that ran out are out of step
				// with the partition's order; the last delivery's is not.
				for _, a := range oks[:len(oks)-1] {
					lateLeases[tx+a.lease] = true
				}
			case acks > 1:
				twice++
				if twice <= 5 {
					t.Logf("%s/%s acked twice: %v", g, tx, r.trail[g+"/"+tx])
				}
			case acks == 1 && inDLQ:
				dlqAndAcked++
			case acks == 0 && !inDLQ && !r.uncertain[g][tx]:
				missing++
				if missing <= 5 {
					t.Logf("%s/%s: %v", g, tx, r.trail[g+"/"+tx])
				}
			}
		}
		for tx, rc := range dlq[g] {
			if rc < retryLimit {
				earlyDLQ++
				t.Logf("%s: %s dead-lettered after %d retries", g, tx, rc)
			}
		}
		assert.Zero(t, twice, "%s: messages acked twice", g)
		assert.Zero(t, missing, "%s: messages neither acked nor dead-lettered", g)
		assert.Zero(t, dlqAndAcked, "%s: messages acked and dead-lettered", g)
		assert.Zero(t, earlyDLQ, "%s: dead-lettered before their retries", g)
		misordered := 0
		for p, evs := range r.order[g] {
			for _, pair := range misorderedAcks(evs, offsets, func(e ackEvent) bool {
				return lateLeases[e.tx+e.lease] || r.uncertain[g][e.tx]
			}) {
				misordered++
				if misordered <= 5 {
					t.Logf("%s/%s: offset %d (%s) acked after %d (%s)", g, p, pair[1].offset, pair[1].tx, pair[0].offset, pair[0].tx)
					t.Logf("  %s: %v; %s: %v", pair[1].tx, r.trail[g+"/"+pair[1].tx], pair[0].tx, r.trail[g+"/"+pair[0].tx])
				}
			}
		}
		assert.Zero(t, misordered, "%s: acks out of push order within a partition", g)
		if g == "g2" {
			assert.Positive(t, len(r.failed[g]), "the failing consumer failed some")
		}
		t.Logf("%s: %d acked, %d dead-lettered, %d acks of unknown outcome (settled by the server), %d acked again after their lease ran out",
			g, len(r.acked[g]), len(dlq[g]), len(r.uncertain[g]), late)
	}
	t.Logf("acks of unknown outcome, by cause: %v", r.unknownWhy)
	report, wrong := reckless.verdict()
	t.Logf("the careless client's acks:%s", report)
	assert.Empty(t, wrong, "careless acks the server must refuse without effect")
	assert.NotEmpty(t, report, "the careless client sent its acks")
	var leased int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM consumers WHERE lease_expires_at > now()`).Scan(&leased))
	assert.Zero(t, leased, "nothing left leased")
	t.Logf("%d messages × %d groups in %v on %d CPUs: %d deliveries (%d redeliveries), worst push → delivery %v; "+
		"faults: %d kill -9 + restart, %d PostgreSQL restart, %d joins (members table, no list), %d leaves (SIGTERM and kill -9), "+
		"%d consumer disconnects, %d syncnet datagrams dropped (30%%)",
		n, len(groups), took.Round(time.Millisecond), runtime.NumCPU(), r.deliveries, r.deliveries-n*len(groups),
		r.worst.Round(time.Millisecond), restarts, pgRestarts, joins, leaves, disconnects, dropped.Load())
	assert.Positive(t, joins, "instances joined during the run")
	assert.GreaterOrEqual(t, leaves, 2, "instances left during the run (stopped and killed)")
}

// finished reports whether every group has finished every partition: its
// cursor (plus what it did out of order) reached the last offset.
// groupChurn creates consumer groups during the run and abandons them.
type groupChurn struct {
	pool    *pgxpool.Pool
	created atomic.Int64
	misread atomic.Int64 // deliveries out of partition order within a churned group
}

func (g *groupChurn) run(ctx context.Context, cl *cluster) {
	for i := 0; ctx.Err() == nil; i++ {
		name := fmt.Sprintf("tab-%05d", i)
		inst := cl.insts[i%3]
		if i%2 == 0 {
			g.ws(ctx, inst.url, name, i%4 == 0)
		} else {
			// An HTTP pop that takes a lease and never acks it.
			if res, err := http.Get(fmt.Sprintf("%s/api/v1/pop/queue/%s?consumerGroup=%s&batch=5&wait=false",
				inst.url, queueName, name)); err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				_ = res.Body.Close()
			}
		}
		g.created.Add(1)
		// Age the groups abandoned so far past the idle time: retention
		// (every 5 s on some instance) removes them, rows and all.
		_, _ = g.pool.Exec(ctx, `UPDATE consumer_groups SET last_seen_at = now() - interval '2 days'
			WHERE name LIKE 'tab-%' AND name < $1`, name)
		sleep(ctx, 300*time.Millisecond)
	}
}

// ws reads a few messages in group name over a WebSocket (autoAck: the
// server acks them as it sends them; otherwise the SDK acks each once
// handled), checking their order per partition, then leaves.
func (g *groupChurn) ws(ctx context.Context, url, name string, autoAck bool) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cli, err := client.Dial(cctx, url, client.Options{})
	if err != nil {
		return
	}
	defer func() { _ = cli.Close() }()
	last := map[string]int{}
	got := 0
	_ = cli.Subscribe(cctx, client.SubscribeOptions{Queue: queueName, ConsumerGroup: name, Batch: 5, MaxInFlight: 10,
		AutoAck: autoAck, SubscriptionMode: "new"},
		func(_ context.Context, m *client.Message) error {
			var v struct{ N int }
			if json.Unmarshal(m.Data, &v) == nil {
				if prev, ok := last[m.PartitionID]; ok && v.N <= prev {
					g.misread.Add(1)
				}
				last[m.PartitionID] = v.N
			}
			if got++; got >= 20 {
				cancel()
			}
			return nil
		})
}

// verify: the churned groups aged past the idle time are gone with their
// rows (retention removed them during or right after the run), and none
// saw its messages out of order.
func (g *groupChurn) verify(t *testing.T, ctx context.Context, dsn string) {
	t.Logf("group churn: %d groups created", g.created.Load())
	assert.Positive(t, g.created.Load())
	assert.Zero(t, g.misread.Load(), "a churned group got a partition's messages out of order")
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	_, err = conn.Exec(ctx, `UPDATE consumer_groups SET last_seen_at = now() - interval '2 days' WHERE name LIKE 'tab-%'`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `UPDATE consumers SET lease_expires_at = now() - interval '1 second' WHERE consumer_group LIKE 'tab-%'`)
	require.NoError(t, err)
	var left, rows int64
	require.Eventually(t, func() bool {
		require.NoError(t, conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM consumer_groups WHERE name LIKE 'tab-%'),
			(SELECT count(*) FROM consumers WHERE consumer_group LIKE 'tab-%')`).Scan(&left, &rows))
		return left == 0 && rows == 0
	}, 30*time.Second, 200*time.Millisecond, "abandoned groups are removed: %d groups, %d rows left", left, rows)
}

func finished(t *testing.T, conn *pgx.Conn, n int) bool {
	var total int64
	if err := conn.QueryRow(context.Background(), `SELECT coalesce(sum(p.last_offset), 0) FROM partitions p
		JOIN queues q ON q.id = p.queue_id WHERE q.name = $1`, queueName).Scan(&total); err != nil || total != int64(n) {
		return false
	}
	var lag, rows int64
	if err := conn.QueryRow(context.Background(), `SELECT coalesce(sum(p.last_offset - c.cursor - cardinality(c.done)), 0), count(*)
		FROM consumers c JOIN partitions p ON p.id = c.partition_id JOIN queues q ON q.id = p.queue_id
		WHERE q.name = $1 AND c.consumer_group = ANY($2)`, queueName, groups).Scan(&lag, &rows); err != nil {
		return false
	}
	return lag == 0 && rows >= int64(partitions*len(groups)) // (and the Default partition, which configure makes)
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer func() { _ = res.Body.Close() }()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func postBytes(url string, body []byte) (int, error) {
	res, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	return res.StatusCode, nil
}
