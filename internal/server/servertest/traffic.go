package servertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// Traffic for failover tests: a Producer pushing numbered messages to the
// partitions of one queue, each push retried with its transactionId until
// it is answered 201, and a Consumer on a WebSocket acking each delivery,
// each ack retried until answered; both record what happened and when, so
// a test can count what was lost, delivered twice or out of order, find
// partitions that stalled, and measure when pushes and deliveries came
// back after a fault.

// Producer pushes {"p":k,"n":n} to partition "p<k>" of a queue, n = 1, 2,
// … per partition, one push at a time per partition (so offsets follow n).
type Producer struct {
	t          testing.TB
	urls       []string
	queue      string
	partitions int
	every      time.Duration // per partition

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	confirmed []int          // per partition: the highest n answered 201
	at        [][]time.Time  // per partition: at[k][n-1] when n was answered 201
	fails     []time.Time    // when an attempt failed
	statuses  map[string]int // failed attempts by status ("503", "error", …)
	attempts  int
}

// StartProducer pushes rate messages a second in all over partitions,
// through urls (an attempt that fails moves to the next one).
func StartProducer(t testing.TB, urls []string, queue string, partitions, rate int) *Producer {
	p := &Producer{t: t, urls: urls, queue: queue, partitions: partitions,
		every:     time.Duration(partitions) * time.Second / time.Duration(rate),
		confirmed: make([]int, partitions), at: make([][]time.Time, partitions), statuses: map[string]int{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	for k := range partitions {
		p.wg.Add(1)
		go p.run(k)
	}
	t.Cleanup(p.Stop)
	return p
}

func (p *Producer) run(k int) {
	defer p.wg.Done()
	client := &http.Client{Timeout: 5 * time.Second}
	next := time.Now().Add(time.Duration(k) * p.every / time.Duration(p.partitions))
	url := k % len(p.urls)
	for n := 1; ; n++ {
		select {
		case <-p.ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		next = next.Add(p.every)
		body := fmt.Sprintf(`{"items":[{"queue":%q,"partition":"p%d","transactionId":"p%d-%d","payload":{"p":%d,"n":%d}}]}`,
			p.queue, k, k, n, k, n)
		backoff := 20 * time.Millisecond
		start := time.Now()
		for {
			status := p.push(client, p.urls[url], body)
			p.mu.Lock()
			p.attempts++
			if status == "201" {
				p.confirmed[k] = n
				p.at[k] = append(p.at[k], time.Now())
				p.mu.Unlock()
				break
			}
			p.fails = append(p.fails, time.Now())
			p.statuses[status]++
			p.mu.Unlock()
			// Even once stopping, a push under way is seen through: its
			// message may be stored already, and must be counted.
			if time.Since(start) > 2*time.Minute {
				p.t.Errorf("push p%d-%d not answered 201 within 2 minutes (last: %s)", k, n, status)
				return
			}
			url = (url + 1) % len(p.urls)
			time.Sleep(backoff)
			backoff = min(backoff*2, 500*time.Millisecond)
		}
	}
}

// push sends one push; its answer's status, or "error".
func (p *Producer) push(client *http.Client, base, body string) string {
	res, err := client.Post(base+"/api/v1/push", "application/json", strings.NewReader(body))
	if err != nil {
		return "error"
	}
	_ = res.Body.Close()
	return fmt.Sprint(res.StatusCode)
}

// Stop stops pushing, after the pushes under way have been answered 201.
func (p *Producer) Stop() {
	p.cancel()
	p.wg.Wait()
}

// Confirmed returns, per partition, the highest n answered 201.
func (p *Producer) Confirmed() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.confirmed)
}

// ConfirmedAt is when message n of partition k was answered 201 (zero if
// it was not).
func (p *Producer) ConfirmedAt(k, n int) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n < 1 || n > len(p.at[k]) {
		return time.Time{}
	}
	return p.at[k][n-1]
}

// Failures returns how many attempts failed, by status, and of how many.
func (p *Producer) Failures() (map[string]int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, v := range p.statuses {
		out[k] = v
	}
	return out, p.attempts
}

// PushesBack is how long after since pushes were answered 201 again: the
// first 201 after the last failed attempt that followed since (or the
// first 201 after since, when none failed). Zero if none came.
func (p *Producer) PushesBack(since time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	from := since
	for _, f := range p.fails {
		if f.After(from) {
			from = f
		}
	}
	first := time.Time{}
	for k := range p.at {
		for _, a := range p.at[k] {
			if a.After(from) && (first.IsZero() || a.Before(first)) {
				first = a
			}
		}
	}
	if first.IsZero() {
		return 0
	}
	return first.Sub(since)
}

// Delivery is one message a Consumer received.
type Delivery struct {
	P, N       int
	RetryCount int
	At         time.Time
}

// Consumer subscribes to a queue on a WebSocket and acks every delivery,
// one ack frame per deliver frame, retrying an ack that fails (an error
// frame, no answer within 5 s) with back-off for up to a minute, as the SDKs do.
// It reconnects when its connection ends.
type Consumer struct {
	t     testing.TB
	url   string
	queue string
	batch int

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	ws         *websocket.Conn
	wmu        sync.Mutex // writes
	deliveries []Delivery
	waiting    map[string]chan ackAnswer // ack frame id → its answer
	nextID     int
	// ackFailed: messages ("p-n") an ack attempt of which failed; a
	// redelivery of them is accounted for.
	ackFailed   map[string]bool
	ackRetries  int
	refusals    map[string]int // per-item ack errors, by text
	reconnects  int
	acked       map[string]bool // acknowledged with success
	ackedAt     map[string]time.Time
	lastAckFail time.Time
}

type ackAnswer struct {
	ok      bool
	results []struct {
		Success bool    `json:"success"`
		Error   *string `json:"error"`
	}
	why string
}

// StartConsumer connects to base (http://…) and subscribes to queue.
func StartConsumer(t testing.TB, base, queue string, batch int) *Consumer {
	c := &Consumer{t: t, url: "ws" + strings.TrimPrefix(base, "http") + "/api/v1/ws", queue: queue, batch: batch,
		waiting: map[string]chan ackAnswer{}, ackFailed: map[string]bool{}, refusals: map[string]int{},
		acked: map[string]bool{}, ackedAt: map[string]time.Time{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(1)
	go c.run()
	t.Cleanup(c.Stop)
	return c
}

// Stop closes the connection and waits for the acks under way.
func (c *Consumer) Stop() {
	c.cancel()
	c.mu.Lock()
	if c.ws != nil {
		_ = c.ws.Close()
	}
	c.mu.Unlock()
	c.wg.Wait()
}

func (c *Consumer) run() {
	defer c.wg.Done()
	for c.ctx.Err() == nil {
		d := websocket.Dialer{Subprotocols: []string{"herald.v1"}, HandshakeTimeout: 5 * time.Second}
		ws, res, err := d.DialContext(c.ctx, c.url, nil)
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		_ = res.Body.Close()
		c.mu.Lock()
		c.ws = ws
		c.mu.Unlock()
		c.write(fmt.Sprintf(`{"type":"subscribe","id":"s","queue":%q,"batch":%d}`, c.queue, c.batch))
		c.read(ws)
		_ = ws.Close()
		c.mu.Lock()
		c.ws = nil
		if c.ctx.Err() == nil {
			c.reconnects++
		}
		c.mu.Unlock()
	}
}

func (c *Consumer) write(frame string) bool {
	c.mu.Lock()
	ws := c.ws
	c.mu.Unlock()
	if ws == nil {
		return false
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return ws.WriteMessage(websocket.TextMessage, []byte(frame)) == nil
}

type wsMessage struct {
	TransactionID string `json:"transactionId"`
	PartitionID   string `json:"partitionId"`
	LeaseID       string `json:"leaseId"`
	RetryCount    int    `json:"retryCount"`
	Data          struct {
		P int `json:"p"`
		N int `json:"n"`
	} `json:"data"`
}

func (c *Consumer) read(ws *websocket.Conn) {
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			return
		}
		var f struct {
			Type     string          `json:"type"`
			ID       json.RawMessage `json:"id"`
			Code     string          `json:"code"`
			Message  string          `json:"message"`
			Messages []wsMessage     `json:"messages"`
			Results  json.RawMessage `json:"results"`
		}
		if json.Unmarshal(data, &f) != nil {
			continue
		}
		switch f.Type {
		case "deliver":
			now := time.Now()
			c.mu.Lock()
			for _, m := range f.Messages {
				c.deliveries = append(c.deliveries, Delivery{P: m.Data.P, N: m.Data.N, RetryCount: m.RetryCount, At: now})
			}
			c.mu.Unlock()
			c.wg.Add(1)
			go c.ack(f.Messages)
		case "ack_result", "error":
			var id string
			_ = json.Unmarshal(f.ID, &id)
			c.mu.Lock()
			ch := c.waiting[id]
			delete(c.waiting, id)
			c.mu.Unlock()
			if ch == nil {
				continue
			}
			a := ackAnswer{ok: f.Type == "ack_result", why: f.Code + ": " + f.Message}
			if a.ok {
				_ = json.Unmarshal(f.Results, &a.results)
			}
			ch <- a
		}
	}
}

// ack acknowledges msgs in one frame, again with back-off until answered.
func (c *Consumer) ack(msgs []wsMessage) {
	defer c.wg.Done()
	var b bytes.Buffer
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"transactionId":%q,"partitionId":%q,"leaseId":%q,"status":"completed"}`,
			m.TransactionID, m.PartitionID, m.LeaseID)
	}
	backoff := 100 * time.Millisecond
	deadline := time.Now().Add(time.Minute)
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		c.nextID++
		id := fmt.Sprint("a", c.nextID)
		ch := make(chan ackAnswer, 1)
		c.waiting[id] = ch
		if attempt > 0 {
			c.ackRetries++
		}
		c.mu.Unlock()
		var a ackAnswer
		if c.write(fmt.Sprintf(`{"type":"ack","id":%q,"items":[%s]}`, id, b.String())) {
			select {
			case a = <-ch:
			case <-time.After(5 * time.Second):
				a.why = "no answer within 5 s"
			case <-c.ctx.Done():
				return
			}
		} else {
			a.why = "connection down"
		}
		c.mu.Lock()
		delete(c.waiting, id)
		if a.ok {
			for i, r := range a.results {
				key := fmt.Sprintf("%d-%d", msgs[i].Data.P, msgs[i].Data.N)
				if r.Success {
					c.acked[key] = true
					if _, ok := c.ackedAt[key]; !ok {
						c.ackedAt[key] = time.Now()
					}
				} else if r.Error != nil {
					c.refusals[*r.Error]++
					c.ackFailed[key] = true
				}
			}
			c.mu.Unlock()
			return
		}
		for _, m := range msgs {
			c.ackFailed[fmt.Sprintf("%d-%d", m.Data.P, m.Data.N)] = true
		}
		c.lastAckFail = time.Now()
		c.mu.Unlock()
		if time.Now().After(deadline) || c.ctx.Err() != nil {
			return
		}
		select {
		case <-time.After(backoff):
		case <-c.ctx.Done():
			return
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// Deliveries returns what was delivered, in order.
func (c *Consumer) Deliveries() []Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.deliveries)
}

// Acked reports whether message n of partition k was acknowledged.
func (c *Consumer) Acked(k, n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.acked[fmt.Sprintf("%d-%d", k, n)]
}

// AckedAt is when message n of partition k was first answered acknowledged
// (zero if it was not).
func (c *Consumer) AckedAt(k, n int) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ackedAt[fmt.Sprintf("%d-%d", k, n)]
}

// AckStats returns the ack attempts that were retried, the per-item
// refusals by text, the messages an ack attempt of which failed, and the
// reconnects.
func (c *Consumer) AckStats() (retries int, refusals map[string]int, failed map[string]bool, reconnects int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	refusals, failed = map[string]int{}, map[string]bool{}
	for k, v := range c.refusals {
		refusals[k] = v
	}
	for k := range c.ackFailed {
		failed[k] = true
	}
	return c.ackRetries, refusals, failed, c.reconnects
}

// DeliveriesBack is how long after since the first message pushed after
// since (answered 201 after it) was delivered; zero if none was.
func DeliveriesBack(p *Producer, c *Consumer, since time.Time) time.Duration {
	for _, d := range c.Deliveries() {
		if at := p.ConfirmedAt(d.P, d.N); !at.IsZero() && at.After(since) && d.At.After(since) {
			return d.At.Sub(since)
		}
	}
	return 0
}

// Report is what a run of a Producer and a Consumer came to.
type Report struct {
	Pushed      int            // messages answered 201
	Lost        []string       // pushed, never delivered ("p-n")
	Duplicates  []string       // delivered more than once
	Unexplained []string       // delivered again, or with a retryCount, with no failed ack to explain it
	Charged     int            // deliveries with retryCount > 0
	OutOfOrder  []string       // a first delivery before an earlier message's
	Stalls      []string       // a partition with messages waiting and no delivery for longer than the bound
	LongestGap  time.Duration  // the longest wait of a partition with messages waiting
	Refusals    map[string]int // per-item ack errors
	AckRetries  int
}

// Check compares what p pushed with what c received by end. Stalls are
// computed from the deliveries: a partition that had a message answered
// 201 and not yet delivered, with no delivery of its for longer than
// stall (until end, for one still waiting then).
func Check(p *Producer, c *Consumer, stall time.Duration, end time.Time) Report {
	return CheckLoss(p, c, stall, end, Loss{})
}

// Loss is what a database that lost committed transactions (a failover to
// an asynchronous standby that had not received them) may explain.
type Loss struct {
	// Gone reports a message answered 201 that the database no longer
	// has: it is not counted lost, and no partition waits for it.
	Gone func(k, n int) bool
	// AckedFrom: a message whose ack was answered success at or after
	// this time may be delivered again (the ack may be gone); zero: none.
	AckedFrom time.Time
}

// CheckLoss is Check for a run in which the database lost what loss
// says.
func CheckLoss(p *Producer, c *Consumer, stall time.Duration, end time.Time, loss Loss) Report {
	conf := p.Confirmed()
	ds := c.Deliveries()
	retries, refusals, failed, _ := c.AckStats()
	gone := func(k, n int) bool { return loss.Gone != nil && loss.Gone(k, n) }
	ackMayBeLost := func(k, n int) bool {
		at := c.AckedAt(k, n)
		return !loss.AckedFrom.IsZero() && !at.IsZero() && !at.Before(loss.AckedFrom)
	}
	r := Report{Refusals: refusals, AckRetries: retries}
	seen := map[[2]int]int{}
	firstOrder := make([]int, len(conf)) // the highest n first-delivered so far
	perPart := make([][]Delivery, len(conf))
	for _, d := range ds {
		if d.P < 0 || d.P >= len(conf) {
			r.Unexplained = append(r.Unexplained, fmt.Sprintf("unknown partition %d", d.P))
			continue
		}
		key := fmt.Sprintf("%d-%d", d.P, d.N)
		seen[[2]int{d.P, d.N}]++
		if d.RetryCount > 0 {
			r.Charged++
		}
		if seen[[2]int{d.P, d.N}] == 1 {
			if d.N < firstOrder[d.P] {
				r.OutOfOrder = append(r.OutOfOrder, key)
			}
			firstOrder[d.P] = max(firstOrder[d.P], d.N)
			perPart[d.P] = append(perPart[d.P], d)
		} else {
			r.Duplicates = append(r.Duplicates, key)
		}
		again := seen[[2]int{d.P, d.N}] > 1 && !ackMayBeLost(d.P, d.N)
		if (again || d.RetryCount > 0) && !failed[key] {
			r.Unexplained = append(r.Unexplained, fmt.Sprintf("%s (delivery %d, retryCount %d)", key,
				seen[[2]int{d.P, d.N}], d.RetryCount))
		}
	}
	for k, n := range conf {
		r.Pushed += n
		waiting := 0      // answered 201, still in the database, never delivered
		firstWaiting := 0 // the first of them
		for i := 1; i <= n; i++ {
			if seen[[2]int{k, i}] == 0 && !gone(k, i) {
				r.Lost = append(r.Lost, fmt.Sprintf("%d-%d", k, i))
				waiting++
				if firstWaiting == 0 {
					firstWaiting = i
				}
			}
		}
		// A partition waits from the 201 of its first undelivered
		// message until the next delivery of it.
		last := time.Time{}
		for _, d := range perPart[k] {
			waitFrom := p.ConfirmedAt(k, d.N)
			if !last.IsZero() && last.After(waitFrom) {
				waitFrom = last
			}
			if gap := d.At.Sub(waitFrom); gap > r.LongestGap {
				r.LongestGap = gap
			}
			if gap := d.At.Sub(waitFrom); gap > stall {
				r.Stalls = append(r.Stalls, fmt.Sprintf("partition %d: %v without a delivery before %d", k,
					gap.Round(time.Millisecond), d.N))
			}
			last = d.At
		}
		if waiting > 0 {
			// Still waiting at the end.
			waitFrom := p.ConfirmedAt(k, firstWaiting)
			if last.After(waitFrom) {
				waitFrom = last
			}
			if gap := end.Sub(waitFrom); gap > stall {
				r.LongestGap = max(r.LongestGap, gap)
				r.Stalls = append(r.Stalls, fmt.Sprintf("partition %d: %v without a delivery, %d messages waiting at the end",
					k, gap.Round(time.Millisecond), waiting))
			}
		}
	}
	return r
}
