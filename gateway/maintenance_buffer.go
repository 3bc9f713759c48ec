package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/spool"
)

// bufferedJSON is one item of a push answered during push maintenance, in
// the reference server's key order.
type bufferedJSON struct {
	Status        string `json:"status"`
	Queue         string `json:"queue"`
	Partition     string `json:"partition"`
	TransactionID string `json:"transactionId"`
}

// bufferedItem is a buffered push item as the buffer file holds it (one
// record, JSON). Payload is absent for an item that had none (stored as
// {}), and the JSON null for an explicit null.
type bufferedItem struct {
	Queue         string          `json:"q"`
	Partition     string          `json:"p,omitempty"`
	Payload       json.RawMessage `json:"d,omitempty"`
	TransactionID string          `json:"t"`
	TraceID       string          `json:"r,omitempty"`
	ProducerSub   string          `json:"s,omitempty"`
}

func encodeBuffered(it queue.PushItem) ([]byte, error) {
	return json.Marshal(bufferedItem{Queue: it.Queue, Partition: it.Partition, Payload: it.Payload,
		TransactionID: it.TransactionID, TraceID: it.TraceID, ProducerSub: it.ProducerSub})
}

func decodeBuffered(rec []byte) (queue.PushItem, error) {
	var b bufferedItem
	if err := json.Unmarshal(rec, &b); err != nil {
		return queue.PushItem{}, fmt.Errorf("decoding a buffered message: %w", err)
	}
	if b.Queue == "" || b.TransactionID == "" {
		return queue.PushItem{}, errors.New("decoding a buffered message: no queue or transaction id")
	}
	return queue.PushItem{Queue: b.Queue, Partition: b.Partition, Payload: b.Payload,
		TransactionID: b.TransactionID, TraceID: b.TraceID, ProducerSub: b.ProducerSub}, nil
}

// Why a push in push maintenance was not buffered.
var (
	errNoBuffer   = errors.New("push maintenance is on and this instance has no push buffer (--buffer-dir): retry when it ends")
	errBufferFull = errors.New("the push buffer is full: retry when push maintenance ends")
)

// buffer writes items to the push buffer instead of the database (push
// maintenance) and returns once they are on disk. Items are checked as a
// push checks them first; an item without a transactionId gets one, so
// that a drain run again after a crash stores it once.
func (m *maintenance) buffer(items []queue.PushItem) ([]bufferedJSON, error) {
	out := make([]bufferedJSON, len(items))
	if len(items) == 0 {
		return out, nil
	}
	if err := queue.ValidatePushItems(items); err != nil {
		return nil, err
	}
	if m.spool == nil {
		return nil, errNoBuffer
	}
	recs := make([][]byte, len(items))
	for i := range items {
		it := &items[i]
		if it.TransactionID == "" {
			it.TransactionID = queue.NewID()
		}
		rec, err := encodeBuffered(*it)
		if err != nil {
			return nil, fmt.Errorf("encoding a buffered message: %w", err)
		}
		recs[i] = rec
		part := it.Partition
		if part == "" {
			part = queue.DefaultPartition
		}
		out[i] = bufferedJSON{Status: "buffered", Queue: it.Queue, Partition: part, TransactionID: it.TransactionID}
	}
	if err := m.spool.Append(recs); err != nil {
		if errors.Is(err, spool.ErrFull) {
			m.refused.Inc()
			return nil, errBufferFull
		}
		return nil, fmt.Errorf("writing the push buffer: %w", err)
	}
	m.appended.Add(float64(len(items)))
	return out, nil
}

// bufferPush answers an HTTP push during push maintenance.
func (s *Server) bufferPush(w http.ResponseWriter, items []queue.PushItem) error {
	out, err := s.maint.buffer(items)
	switch {
	case errors.Is(err, errBufferFull) || errors.Is(err, errNoBuffer):
		w.Header().Set("Retry-After", "5")
		return httpapi.Status(http.StatusServiceUnavailable, err.Error())
	case err != nil:
		return err
	}
	httpapi.WriteJSON(w, http.StatusCreated, out)
	return nil
}

// bufferWSPush answers a WebSocket push frame during push maintenance.
func (c *wsConn) bufferPush(f *wsFrame, items []queue.PushItem) {
	out, err := c.ss.s.maint.buffer(items)
	switch {
	case errors.Is(err, errBufferFull) || errors.Is(err, errNoBuffer):
		c.ss.send(wsError(f.ID, "unavailable", err.Error()))
	case err != nil:
		c.ss.s.log.Error().Err(err).Msg("buffering a WebSocket push")
		c.ss.send(wsStoreError(f.ID, err, "buffering the push failed"))
	default:
		c.ss.send(map[string]any{"type": "push_result", "id": f.ID, "results": out})
	}
}

// storeRecords is the drain's spool.Store: it pushes a batch of buffered
// messages, in order, as one push. A record that cannot be read, or an
// item the queue refuses as bad input (it was checked when buffered, so
// only a change since, such as a queue now encrypted without a key), is
// logged, counted and skipped: it could never be stored. A queue at its
// maxSize stops the drain before the refused item, which waits for room.
// Duplicates (a batch stored before a crash, offered again) are stored
// once: the push dedups by (partition, transactionId).
func (m *maintenance) storeRecords(ctx context.Context, recs [][]byte) (int, error) {
	items := make([]queue.PushItem, 0, len(recs))
	idx := make([]int, 0, len(recs)) // the record of each item
	for i, rec := range recs {
		it, err := decodeBuffered(rec)
		if err != nil {
			m.drop()
			m.log.Error().Err(err).Msg("dropping an unreadable record of the push buffer")
			continue
		}
		items, idx = append(items, it), append(idx, i)
	}
	if len(items) == 0 {
		return len(recs), nil
	}
	results, err := m.s.store.Push(ctx, items)
	if queue.IsInputError(err) {
		return m.storeEach(ctx, recs, items, idx)
	}
	if err != nil {
		m.dbHealthy.Store(false)
		return idx[0], err // unreadable records before the first item are done with
	}
	m.s.afterPush(results)
	for j, r := range results {
		if r.Status == queue.StatusRejected {
			m.drained.Add(float64(j))
			return idx[j], fmt.Errorf("queue %s refused a buffered message (%s): the drain waits for room", r.Queue, r.Error)
		}
	}
	m.drained.Add(float64(len(items)))
	return len(recs), nil
}

// storeEach pushes items one at a time, to find those the queue refuses
// as bad input and skip only them.
func (m *maintenance) storeEach(ctx context.Context, recs [][]byte, items []queue.PushItem, idx []int) (int, error) {
	for j, it := range items {
		results, err := m.s.store.Push(ctx, []queue.PushItem{it})
		switch {
		case queue.IsInputError(err):
			m.drop()
			m.log.Error().Err(err).Str("queue", it.Queue).Str("transaction_id", it.TransactionID).
				Msg("dropping a buffered message the queue refuses")
			continue
		case err != nil:
			m.dbHealthy.Store(false)
			return idx[j], err
		}
		m.s.afterPush(results)
		if results[0].Status == queue.StatusRejected {
			return idx[j], fmt.Errorf("queue %s refused a buffered message (%s): the drain waits for room", it.Queue, results[0].Error)
		}
		m.drained.Inc()
	}
	return len(recs), nil
}
