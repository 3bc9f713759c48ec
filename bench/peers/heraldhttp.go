package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/heraldmq/herald/internal/benchstat"
)

// The HTTP consumers below share the herald process of the WebSocket row
// (one server, one database, the same producers); each run pushes to a
// queue of its own, so the rows do not see each other's messages.

// httpMessage is the part of a delivered message (pop or SSE data) the
// consumers need: the payload to time and the ids to ack.
type httpMessage struct {
	TransactionID string          `json:"transactionId"`
	PartitionID   string          `json:"partitionId"`
	LeaseID       string          `json:"leaseId"`
	Data          json.RawMessage `json:"data"`
}

// ackItem is one element of POST /api/v1/ack/batch.
type ackItem struct {
	TransactionID string `json:"transactionId"`
	PartitionID   string `json:"partitionId"`
	LeaseID       string `json:"leaseId,omitempty"`
}

func ackOf(m httpMessage) ackItem {
	return ackItem{TransactionID: m.TransactionID, PartitionID: m.PartitionID, LeaseID: m.LeaseID}
}

// ackBatch acknowledges items with one POST /api/v1/ack/batch and checks
// every per-item result, so a lost ack shows as an error, not as a stall.
func (h *heraldSys) ackBatch(ctx context.Context, items []ackItem) error {
	body, err := json.Marshal(map[string]any{"acknowledgments": items})
	if err != nil {
		return fmt.Errorf("encoding acks: %w", err)
	}
	b, err := call(ctx, h.http, http.MethodPost, h.url+"/api/v1/ack/batch", body, http.StatusOK, "acking")
	if err != nil {
		return err
	}
	var out []struct {
		Success bool    `json:"success"`
		Error   *string `json:"error"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return fmt.Errorf("decoding the ack answer: %w", err)
	}
	for _, r := range out {
		if !r.Success {
			e := ""
			if r.Error != nil {
				e = *r.Error
			}
			return fmt.Errorf("acking: %s", e)
		}
	}
	return nil
}

// heraldVariant runs Herald with another consumer: SSE or long-poll.
type heraldVariant struct {
	*heraldSys
	kind    string // "herald-sse" or "herald-longpoll"
	n       int
	consume func(ctx context.Context, q string, rec *benchstat.Recorder) error
}

func newHeraldSSE(h *heraldSys) *heraldVariant {
	v := &heraldVariant{heraldSys: h, kind: "herald-sse"}
	v.consume = v.consumeSSE
	return v
}

func newHeraldLongPoll(h *heraldSys) *heraldVariant {
	v := &heraldVariant{heraldSys: h, kind: "herald-longpoll"}
	v.consume = v.consumeLongPoll
	return v
}

func (v *heraldVariant) name() string { return v.kind }

func (v *heraldVariant) run(ctx context.Context, rate int, warm, dur time.Duration) (sample, error) {
	v.n++
	q := fmt.Sprintf("peers-%s-%d-%d", strings.TrimPrefix(v.kind, "herald-"), rate, v.n)
	rec := benchstat.NewRecorder(runLength(rate, warm, dur))
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- v.consume(cctx, q, rec) }()
	s, err := measure(ctx, rate, warm, dur, v.cpu, rec, func(ctx context.Context, i int, p []byte) error {
		body := fmt.Sprintf(`{"items":[{"queue":%q,"partition":"p%d","payload":%s}]}`, q, i%v.partitions, p)
		return v.post(ctx, "/api/v1/push", body)
	})
	cancel()
	if cerr := <-done; cerr != nil && !errors.Is(cerr, context.Canceled) && err == nil {
		err = fmt.Errorf("consuming: %w", cerr)
	}
	return s, err
}

// consumeSSE reads the stream as an EventSource does (event:/data:/id:
// lines, a blank line ends an event), times each message when its event
// is complete, and acks from a goroutine of its own with
// POST /api/v1/ack/batch, as a page would with fetch: every ack queued
// while the previous POST was in flight goes in the next one, so acks of
// one delivery usually share a request. A stream that ends is reopened
// with Last-Event-ID, as EventSource would.
func (v *heraldVariant) consumeSSE(ctx context.Context, q string, rec *benchstat.Recorder) error {
	acks := make(chan ackItem, 4096)
	ackErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() { ackErr <- v.ackLoop(ctx, acks) })
	defer wg.Wait()
	lastID := ""
	for ctx.Err() == nil {
		id, err := v.readSSE(ctx, q, lastID, rec, acks)
		if id != "" {
			lastID = id
		}
		select {
		case aerr := <-ackErr:
			return aerr
		default:
		}
		if err != nil && ctx.Err() == nil {
			return err
		}
	}
	return ctx.Err()
}

func (v *heraldVariant) ackLoop(ctx context.Context, acks <-chan ackItem) error {
	for {
		var items []ackItem
		select {
		case a := <-acks:
			items = append(items, a)
		case <-ctx.Done():
			return nil
		}
	drain:
		for {
			select {
			case a := <-acks:
				items = append(items, a)
			default:
				break drain
			}
		}
		if err := v.ackBatch(ctx, items); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// readSSE reads one connection's events until it ends; it returns the
// last event id seen.
func (v *heraldVariant) readSSE(ctx context.Context, q, lastID string, rec *benchstat.Recorder, acks chan<- ackItem) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		v.url+"/api/v1/sse/queue/"+q+"?batch=10&maxInFlight=100", nil)
	if err != nil {
		return "", fmt.Errorf("building the SSE request: %w", err)
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	// The stream outlives the shared client's one-minute timeout.
	res, err := (&http.Client{Transport: v.http.Transport}).Do(req)
	if err != nil {
		return "", fmt.Errorf("opening the SSE stream: %w", err)
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		return "", fmt.Errorf("opening the SSE stream: %d %s", res.StatusCode, b)
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var event, data, id string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if event == "message" && data != "" {
				now := time.Now()
				var m httpMessage
				if err := json.Unmarshal([]byte(data), &m); err != nil {
					return id, fmt.Errorf("decoding an SSE message: %w", err)
				}
				rec.RecordJSON(m.Data, now)
				select {
				case acks <- ackOf(m):
				case <-ctx.Done():
					return id, ctx.Err()
				}
			}
			event, data = "", ""
		case strings.HasPrefix(line, "event:"):
			event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data += strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")
		case strings.HasPrefix(line, "id:"):
			id = strings.TrimPrefix(strings.TrimPrefix(line, "id:"), " ")
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return id, fmt.Errorf("reading the SSE stream: %w", err)
	}
	return id, nil
}

// consumeLongPoll pops in a loop (wait=true, up to 10 messages over up to
// --partitions partitions) and acks each pop's messages with one ack/batch before
// the next pop, as a simple HTTP worker would.
func (v *heraldVariant) consumeLongPoll(ctx context.Context, q string, rec *benchstat.Recorder) error {
	url := fmt.Sprintf("%s/api/v1/pop/queue/%s?wait=true&timeout=30000&batch=10&partitions=%d", v.url, q, v.partitions)
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("building a pop request: %w", err)
		}
		res, err := v.http.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("popping: %w", err)
		}
		b, err := io.ReadAll(res.Body)
		_ = res.Body.Close()
		now := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reading a pop: %w", err)
		}
		if res.StatusCode == http.StatusNoContent {
			continue
		}
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("popping: %d %s", res.StatusCode, b)
		}
		var pop struct {
			Messages []httpMessage `json:"messages"`
		}
		if err := json.Unmarshal(b, &pop); err != nil {
			return fmt.Errorf("decoding a pop: %w", err)
		}
		items := make([]ackItem, 0, len(pop.Messages))
		for _, m := range pop.Messages {
			rec.RecordJSON(m.Data, now)
			items = append(items, ackOf(m))
		}
		if len(items) == 0 {
			continue
		}
		if err := v.ackBatch(ctx, items); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	return nil
}
