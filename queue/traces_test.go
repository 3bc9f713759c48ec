package queue_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// record records a trace about a pushed message and expects it stored.
func record(t *testing.T, s *queue.Store, m queue.PushResult, event string, data string, names ...string) string {
	t.Helper()
	res, err := s.RecordTrace(ctxT(t), queue.NewTrace{PartitionID: m.PartitionID, TransactionID: m.TransactionID,
		EventType: event, Data: json.RawMessage(data), Names: names})
	require.NoError(t, err)
	require.True(t, res.Found, "the message exists")
	require.True(t, queue.ValidUUID(res.ID), res.ID)
	return res.ID
}

func execSQL(t *testing.T, s *queue.Store, sql string, args ...any) int64 {
	t.Helper()
	tag, err := s.Pool().Exec(ctxT(t), sql, args...)
	require.NoError(t, err)
	return tag.RowsAffected()
}

func countTraces(t *testing.T, s *queue.Store) int {
	t.Helper()
	var n int
	require.NoError(t, s.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM traces`).Scan(&n))
	return n
}

func TestTrace_RecordAndReadOldestFirst(t *testing.T) {
	s := newStore(t)
	m := push(t, s, "orders", "eu", map[string]int{"n": 1})[0]
	other := push(t, s, "orders", "eu", map[string]int{"n": 2})[0]

	first := record(t, s, m, "", `{"step":"received"}`, "order-42", "order-42", "batch-7")
	res, err := s.RecordTrace(ctxT(t), queue.NewTrace{PartitionID: m.PartitionID, TransactionID: m.TransactionID,
		Group: "billing", EventType: "error", Data: json.RawMessage(`[1,"two",null]`)})
	require.NoError(t, err)
	require.True(t, res.Found)
	third := record(t, s, m, "processing", `null`, "order-42")
	record(t, s, other, "info", `{}`) // another message's trace: not listed below

	traces, err := s.TracesOf(ctxT(t), m.PartitionID, m.TransactionID)
	require.NoError(t, err)
	require.Len(t, traces, 3)
	assert.Equal(t, []string{first, res.ID, third}, []string{traces[0].ID, traces[1].ID, traces[2].ID}, "oldest first")
	assert.True(t, !traces[0].CreatedAt.After(traces[1].CreatedAt) && !traces[1].CreatedAt.After(traces[2].CreatedAt))

	a := traces[0]
	assert.Equal(t, queue.DefaultGroup, a.Group, "no group: queue mode")
	assert.Equal(t, queue.TraceEventDefault, a.EventType, "no event type: info")
	assert.Equal(t, "test", a.WorkerID, "the recording instance")
	assert.Equal(t, []string{"batch-7", "order-42"}, a.Names, "duplicates collapse, sorted")
	assert.JSONEq(t, `{"step":"received"}`, string(a.Data))
	assert.Equal(t, m.PartitionID, a.PartitionID)
	assert.Equal(t, m.TransactionID, a.TransactionID)
	assert.EqualValues(t, 1, a.Seq, "the message's offset")
	assert.WithinDuration(t, time.Now(), a.CreatedAt, time.Minute)

	b := traces[1]
	assert.Equal(t, "billing", b.Group)
	assert.Equal(t, "error", b.EventType)
	assert.Equal(t, []string{}, b.Names, "no names: an empty list")
	assert.JSONEq(t, `[1,"two",null]`, string(b.Data))
	assert.Equal(t, "null", string(traces[2].Data), "JSON null is data too")

	none, err := s.TracesOf(ctxT(t), m.PartitionID, "no-such-tx")
	require.NoError(t, err)
	assert.Equal(t, []queue.Trace{}, none, "no traces: an empty list")
}

// Many traces of one message recorded at once all come back, in the order
// of their timestamps.
func TestTrace_ConcurrentRecordsOrdered(t *testing.T) {
	s := newStore(t)
	m := push(t, s, "q", "", 1)[0]
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() { record(t, s, m, "info", fmt.Sprint(i), "flow") })
	}
	wg.Wait()
	traces, err := s.TracesOf(ctxT(t), m.PartitionID, m.TransactionID)
	require.NoError(t, err)
	require.Len(t, traces, 20)
	for i := 1; i < len(traces); i++ {
		assert.False(t, traces[i].CreatedAt.Before(traces[i-1].CreatedAt), "oldest first at %d", i)
	}
}

func TestTrace_RecordUnknownMessage(t *testing.T) {
	s := newStore(t)
	m := push(t, s, "q", "", 1)[0]
	for _, ref := range [][2]string{
		{m.PartitionID, "never-pushed"},
		{queue.NewID(), m.TransactionID}, // no such partition
	} {
		res, err := s.RecordTrace(ctxT(t), queue.NewTrace{PartitionID: ref[0], TransactionID: ref[1], Data: json.RawMessage(`{}`)})
		require.NoError(t, err, "a result, not an error")
		assert.False(t, res.Found, "%v", ref)
		assert.Empty(t, res.ID)
	}
	// The message deleted (retention, a delete): nothing to attach to.
	execSQL(t, s, `DELETE FROM messages`)
	res, err := s.RecordTrace(ctxT(t), queue.NewTrace{PartitionID: m.PartitionID, TransactionID: m.TransactionID, Data: json.RawMessage(`1`)})
	require.NoError(t, err)
	assert.False(t, res.Found)
	assert.Zero(t, countTraces(t, s))
}

func TestTrace_RecordValidation(t *testing.T) {
	s := newStore(t)
	m := push(t, s, "q", "", 1)[0]
	ok := func() queue.NewTrace {
		return queue.NewTrace{PartitionID: m.PartitionID, TransactionID: m.TransactionID, Data: json.RawMessage(`{}`)}
	}
	many := func(n int, prefix string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%s%d", prefix, i)
		}
		return out
	}
	for name, c := range map[string]struct {
		edit func(*queue.NewTrace)
		want string
	}{
		"partition not a UUID":   {func(n *queue.NewTrace) { n.PartitionID = "p-1" }, "partitionId must be a UUID"},
		"no transaction id":      {func(n *queue.NewTrace) { n.TransactionID = "" }, "transactionId must not be empty"},
		"long transaction id":    {func(n *queue.NewTrace) { n.TransactionID = strings.Repeat("x", 1025) }, "at most 1024 bytes"},
		"NUL in transaction id":  {func(n *queue.NewTrace) { n.TransactionID = "a\x00b" }, "NUL"},
		"group control char":     {func(n *queue.NewTrace) { n.Group = "a\nb" }, "consumerGroup must not contain control characters"},
		"long event type":        {func(n *queue.NewTrace) { n.EventType = strings.Repeat("e", 256) }, "eventType must be at most 255 bytes"},
		"NUL in event type":      {func(n *queue.NewTrace) { n.EventType = "a\x00" }, "eventType must not contain control characters"},
		"no data":                {func(n *queue.NewTrace) { n.Data = nil }, "data is required"},
		"data not JSON":          {func(n *queue.NewTrace) { n.Data = json.RawMessage(`{"a":`) }, "data must be JSON"},
		"data over 64 KiB":       {func(n *queue.NewTrace) { n.Data = json.RawMessage(`"` + strings.Repeat("x", 64<<10) + `"`) }, "data must be at most 65536 bytes"},
		"NUL in data":            {func(n *queue.NewTrace) { n.Data = json.RawMessage(`{"a":["x\u0000y"]}`) }, "data must not contain NUL"},
		"NUL in a data key":      {func(n *queue.NewTrace) { n.Data = json.RawMessage(`{"\u0000":1}`) }, "data must not contain NUL"},
		"101 names":              {func(n *queue.NewTrace) { n.Names = many(101, "n") }, "at most 100 names"},
		"name over 256 bytes":    {func(n *queue.NewTrace) { n.Names = []string{strings.Repeat("n", 257)} }, "at most 256 bytes"},
		"empty name":             {func(n *queue.NewTrace) { n.Names = []string{"a", ""} }, "must not be empty"},
		"name with control char": {func(n *queue.NewTrace) { n.Names = []string{"a\tb"} }, "control characters"},
		"name with NUL":          {func(n *queue.NewTrace) { n.Names = []string{"a\x00b"} }, "control characters"},
		"name not UTF-8":         {func(n *queue.NewTrace) { n.Names = []string{"a\xffb"} }, "UTF-8"},
	} {
		nt := ok()
		c.edit(&nt)
		_, err := s.RecordTrace(ctxT(t), nt)
		require.Error(t, err, name)
		assert.True(t, queue.IsInputError(err), "%s: %v", name, err)
		assert.Contains(t, err.Error(), c.want, name)
	}
	assert.Zero(t, countTraces(t, s), "nothing refused was stored")

	// At the bounds: 100 distinct names (given 200 times), a 256-byte name,
	// 64 KiB of data, an escaped backslash before u0000 (not a NUL).
	nt := ok()
	nt.Names = append(many(100, "n"), many(100, "n")...)
	nt.Names[0], nt.Names[100] = strings.Repeat("n", 256), strings.Repeat("n", 256)
	nt.Data = json.RawMessage(`"` + strings.Repeat("x", 64<<10-2) + `"`)
	res, err := s.RecordTrace(ctxT(t), nt)
	require.NoError(t, err)
	assert.True(t, res.Found)
	nt = ok()
	nt.Data = json.RawMessage(`{"path":"C:\\u0000"}`)
	res, err = s.RecordTrace(ctxT(t), nt)
	require.NoError(t, err)
	assert.True(t, res.Found)

	// Reads check their input the same way.
	for _, ref := range [][2]string{{"nope", "tx"}, {m.PartitionID, ""}, {m.PartitionID, "a\x00"}} {
		_, err := s.TracesOf(ctxT(t), ref[0], ref[1])
		assert.True(t, queue.IsInputError(err), "%q: %v", ref, err)
	}
}

func TestTrace_ByNamePaginationAndWindow(t *testing.T) {
	s := newStore(t)
	orders := push(t, s, "orders", "eu", map[string]string{"order": "42"})[0]
	billing := push(t, s, "billing", "", map[string]string{"invoice": "7"})[0]
	var ids []string
	for i := range 5 {
		m := orders
		if i%2 == 1 {
			m = billing
		}
		ids = append(ids, record(t, s, m, "info", fmt.Sprintf(`{"i":%d}`, i), "order-42"))
	}
	record(t, s, orders, "info", `{}`, "order-43") // another name

	page := func(q queue.TraceQuery) *queue.TracePage {
		t.Helper()
		q.Name = "order-42"
		p, err := s.TracesByName(ctxT(t), q)
		require.NoError(t, err)
		return p
	}
	idsOf := func(p *queue.TracePage) []string {
		out := []string{}
		for _, tr := range p.Traces {
			out = append(out, tr.ID)
		}
		return out
	}

	all := page(queue.TraceQuery{})
	assert.Equal(t, ids, idsOf(all), "oldest first")
	assert.EqualValues(t, 5, all.Total)
	assert.Equal(t, queue.TraceLimitDefault, all.Limit)
	assert.Equal(t, 0, all.Offset)

	first := all.Traces[0]
	assert.Equal(t, "orders", first.Queue)
	assert.Equal(t, "eu", first.Partition)
	assert.JSONEq(t, `{"order":"42"}`, string(first.MessagePayload))
	assert.Equal(t, []string{"order-42"}, first.Names)
	assert.Equal(t, orders.TransactionID, first.TransactionID)
	assert.Equal(t, "billing", all.Traces[1].Queue)
	assert.Equal(t, queue.DefaultPartition, all.Traces[1].Partition)
	assert.JSONEq(t, `{"invoice":"7"}`, string(all.Traces[1].MessagePayload))

	// limit truncates, offset skips, total counts them all.
	p := page(queue.TraceQuery{Limit: 2})
	assert.Equal(t, ids[:2], idsOf(p))
	assert.EqualValues(t, 5, p.Total)
	p = page(queue.TraceQuery{Limit: 2, Offset: 2})
	assert.Equal(t, ids[2:4], idsOf(p))
	p = page(queue.TraceQuery{Limit: 2, Offset: 4})
	assert.Equal(t, ids[4:], idsOf(p))
	assert.Equal(t, 4, p.Offset)
	p = page(queue.TraceQuery{Offset: 5})
	assert.Equal(t, []string{}, idsOf(p), "past the end: an empty list")
	assert.EqualValues(t, 5, p.Total)

	// from (inclusive) and to (exclusive): the window of the middle three.
	p = page(queue.TraceQuery{From: all.Traces[1].CreatedAt, To: all.Traces[4].CreatedAt})
	assert.Equal(t, ids[1:4], idsOf(p))
	assert.EqualValues(t, 3, p.Total, "total counts within the window")
	p = page(queue.TraceQuery{From: all.Traces[4].CreatedAt.Add(time.Second)})
	assert.Empty(t, p.Traces)
	assert.Zero(t, p.Total)

	// A partition match (a token's rights) narrows list and total.
	p = page(queue.TraceQuery{PartitionMatch: "^orders" + queue.PartitionMatchSep + "eu$"})
	assert.Equal(t, []string{ids[0], ids[2], ids[4]}, idsOf(p))
	assert.EqualValues(t, 3, p.Total)
	p = page(queue.TraceQuery{PartitionMatch: "^nothing$"})
	assert.Empty(t, p.Traces)
	assert.Zero(t, p.Total)

	// The message gone (retention): its traces stay, without its payload.
	execSQL(t, s, `DELETE FROM messages WHERE transaction_id = $1`, billing.TransactionID)
	p = page(queue.TraceQuery{})
	require.Len(t, p.Traces, 5)
	assert.Nil(t, p.Traces[1].MessagePayload, "the message is gone")
	assert.NotNil(t, p.Traces[0].MessagePayload)
	traces, err := s.TracesOf(ctxT(t), billing.PartitionID, billing.TransactionID)
	require.NoError(t, err)
	assert.Len(t, traces, 2, "traces outlive their message")

	// Bounds.
	for _, q := range []queue.TraceQuery{{Name: "order-42", Limit: -1}, {Name: "order-42", Limit: queue.MaxTraceLimit + 1},
		{Name: "order-42", Offset: -1}, {Name: ""}, {Name: strings.Repeat("n", 257)}, {Name: "a\x00"},
		{Name: "x", PartitionMatch: "a\x00"}} {
		_, err := s.TracesByName(ctxT(t), q)
		assert.True(t, queue.IsInputError(err), "%+v: %v", q, err)
	}
	p, err = s.TracesByName(ctxT(t), queue.TraceQuery{Name: "order-42", Limit: queue.MaxTraceLimit})
	require.NoError(t, err)
	assert.Len(t, p.Traces, 5)
}

// An encrypted queue's payload comes back decrypted, as on every read.
func TestTrace_ByNameDecryptsPayload(t *testing.T) {
	ctx := ctxT(t)
	plain := newStore(t)
	s, err := queue.New(queue.Config{Pool: plain.Pool(), InstanceID: "test", EncryptionKey: bytes.Repeat([]byte{7}, 32)})
	require.NoError(t, err)
	require.NoError(t, s.CheckEncryption(ctx))
	_, err = s.Configure(ctx, queue.ConfigureRequest{Queue: "sec", Options: json.RawMessage(`{"encryptionEnabled":true}`)})
	require.NoError(t, err)
	res, err := s.Push(ctx, []queue.PushItem{{Queue: "sec", Payload: json.RawMessage(`{"card":"4111"}`)}})
	require.NoError(t, err)
	record(t, s, res[0], "info", `{}`, "pay")
	p, err := s.TracesByName(ctx, queue.TraceQuery{Name: "pay"})
	require.NoError(t, err)
	require.Len(t, p.Traces, 1)
	assert.JSONEq(t, `{"card":"4111"}`, string(p.Traces[0].MessagePayload))
	// A payload that does not decrypt (bound to another transaction id
	// now) is null, never the envelope.
	execSQL(t, s, `UPDATE messages SET transaction_id = 'moved'`)
	execSQL(t, s, `UPDATE traces SET transaction_id = 'moved'`)
	p, err = s.TracesByName(ctx, queue.TraceQuery{Name: "pay"})
	require.NoError(t, err)
	assert.Nil(t, p.Traces[0].MessagePayload, "a payload that does not decrypt is null, never the envelope")
}

func TestTrace_Names(t *testing.T) {
	s := newStore(t)
	a := push(t, s, "orders", "eu", 1)[0]
	b := push(t, s, "orders", "eu", 2)[0]
	c := push(t, s, "mail", "bob", 3)[0]
	record(t, s, a, "info", `1`, "flow-a", "shared")
	record(t, s, a, "info", `2`, "flow-a")
	record(t, s, b, "info", `3`, "flow-a", "flow-a")
	record(t, s, c, "info", `4`, "shared")
	record(t, s, c, "info", `5`, "bob-only")
	record(t, s, a, "info", `6`) // no name: not listed

	p, err := s.TraceNames(ctxT(t), queue.TraceNamesQuery{})
	require.NoError(t, err)
	assert.EqualValues(t, 3, p.Total)
	assert.Equal(t, queue.TraceNamesLimitDefault, p.Limit)
	require.Len(t, p.Names, 3)
	// Most recently seen first: bob-only (trace 5), shared (4), flow-a (3).
	assert.Equal(t, "bob-only", p.Names[0].Name)
	assert.Equal(t, "shared", p.Names[1].Name)
	assert.Equal(t, "flow-a", p.Names[2].Name)
	assert.EqualValues(t, 3, p.Names[2].Traces, "three traces carry flow-a (one named it twice)")
	assert.EqualValues(t, 2, p.Names[2].Messages, "on two messages")
	assert.EqualValues(t, 2, p.Names[1].Traces)
	assert.EqualValues(t, 2, p.Names[1].Messages)
	assert.True(t, p.Names[0].LastSeen.After(p.Names[2].LastSeen))

	p, err = s.TraceNames(ctxT(t), queue.TraceNamesQuery{Limit: 1, Offset: 1})
	require.NoError(t, err)
	require.Len(t, p.Names, 1)
	assert.Equal(t, "shared", p.Names[0].Name)
	assert.EqualValues(t, 3, p.Total)
	p, err = s.TraceNames(ctxT(t), queue.TraceNamesQuery{Offset: 3})
	require.NoError(t, err)
	assert.Empty(t, p.Names)
	assert.Equal(t, []queue.TraceName{}, p.Names)
	assert.EqualValues(t, 3, p.Total, "past the end, total still counts the names")

	// A partition match: what traces on mail/bob carry.
	p, err = s.TraceNames(ctxT(t), queue.TraceNamesQuery{PartitionMatch: "^mail" + queue.PartitionMatchSep + "bob$"})
	require.NoError(t, err)
	assert.EqualValues(t, 2, p.Total)
	require.Len(t, p.Names, 2)
	assert.Equal(t, "bob-only", p.Names[0].Name)
	assert.Equal(t, "shared", p.Names[1].Name)
	assert.EqualValues(t, 1, p.Names[1].Traces, "only the trace on mail/bob counts")

	for _, q := range []queue.TraceNamesQuery{{Limit: -1}, {Limit: queue.MaxTraceLimit + 1}, {Offset: -1}} {
		_, err := s.TraceNames(ctxT(t), q)
		assert.True(t, queue.IsInputError(err), "%+v: %v", q, err)
	}
}

func TestTrace_RetentionDeletesOldOnly(t *testing.T) {
	s := newStore(t)
	m := push(t, s, "q", "", 1)[0]
	for i := range 7 {
		record(t, s, m, "info", fmt.Sprint(i), "flow")
	}
	// Five traces recorded two hours ago, two just now.
	require.EqualValues(t, 5, execSQL(t, s, `UPDATE traces SET created_at = now() - interval '2 hours'
		WHERE id IN (SELECT id FROM traces ORDER BY created_at LIMIT 5)`))
	n, err := s.PruneTraces(ctxT(t), 3*time.Hour, 2)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing is three hours old")
	n, err = s.PruneTraces(ctxT(t), time.Hour, 2) // three batches: 2, 2, 1
	require.NoError(t, err)
	assert.EqualValues(t, 5, n)
	traces, err := s.TracesOf(ctxT(t), m.PartitionID, m.TransactionID)
	require.NoError(t, err)
	require.Len(t, traces, 2, "the recent ones stay")
	assert.JSONEq(t, "5", string(traces[0].Data))
	assert.JSONEq(t, "6", string(traces[1].Data))
	_, err = s.PruneTraces(ctxT(t), 0, 0)
	assert.Error(t, err, "an age is required")
}

// The hygiene loop prunes with the store's retention, and keeps
// everything with a negative one.
func TestTrace_HygieneLoopPrunes(t *testing.T) {
	base := newStore(t)
	m := push(t, base, "q", "", 1)[0]
	record(t, base, m, "info", `"old"`)
	record(t, base, m, "info", `"new"`)
	execSQL(t, base, `UPDATE traces SET created_at = now() - interval '2 hours' WHERE data = '"old"'`)

	loop := func(retention time.Duration) {
		t.Helper()
		s, err := queue.New(queue.Config{Pool: base.Pool(), TraceRetention: retention})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(ctxT(t))
		sampled := make(chan struct{}, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = s.RunHygieneLoop(ctx, 10*time.Millisecond, func(*queue.Hygiene) {
				select {
				case sampled <- struct{}{}:
				default:
				}
			})
		}()
		select {
		case <-sampled: // pruning runs before the sample, in the same tick
		case <-time.After(10 * time.Second):
			t.Fatal("the hygiene loop reported nothing")
		}
		cancel()
		<-done
	}
	loop(-1)
	assert.Equal(t, 2, countTraces(t, base), "negative retention: kept forever")
	loop(time.Hour)
	traces, err := base.TracesOf(ctxT(t), m.PartitionID, m.TransactionID)
	require.NoError(t, err)
	require.Len(t, traces, 1)
	assert.Equal(t, `"new"`, string(traces[0].Data))
}

func TestTrace_QueueDeletionRemovesTraces(t *testing.T) {
	s := newStore(t)
	gone := push(t, s, "gone", "p1", 1)[0]
	kept := push(t, s, "kept", "", 1)[0]
	record(t, s, gone, "info", `1`, "shared")
	record(t, s, kept, "info", `2`, "shared")
	existed, err := s.DeleteQueue(ctxT(t), "gone")
	require.NoError(t, err)
	require.True(t, existed)
	assert.Equal(t, 1, countTraces(t, s))
	traces, err := s.TracesOf(ctxT(t), gone.PartitionID, gone.TransactionID)
	require.NoError(t, err)
	assert.Empty(t, traces)
	p, err := s.TracesByName(ctxT(t), queue.TraceQuery{Name: "shared"})
	require.NoError(t, err)
	require.Len(t, p.Traces, 1)
	assert.Equal(t, "kept", p.Traces[0].Queue)
	// A queue of the same name made again starts without traces.
	again := push(t, s, "gone", "p1", 1)[0]
	traces, err = s.TracesOf(ctxT(t), again.PartitionID, gone.TransactionID)
	require.NoError(t, err)
	assert.Empty(t, traces)
}
