package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/auth/authtest"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/queue/queuetest"
)

// The reference server's resources, messages and status reads,
// computed live from Herald's partition and consumer rows, with Herald's
// honest status codes and a token's rights applied.

type countsBody struct {
	Total      int64 `json:"total"`
	Pending    int64 `json:"pending"`
	Processing int64 `json:"processing"`
	Completed  int64 `json:"completed"`
	Failed     int64 `json:"failed"`
	DeadLetter int64 `json:"deadLetter"`
}

type pageBody struct {
	Limit  int   `json:"limit"`
	Offset int   `json:"offset"`
	Total  int64 `json:"total"`
}

type queueItemBody struct {
	ID         string  `json:"id"`
	Name       string  `json:"name"`
	Namespace  *string `json:"namespace"`
	Task       *string `json:"task"`
	CreatedAt  string  `json:"createdAt"`
	Partitions int64   `json:"partitions"`
	Messages   struct {
		Total      int64 `json:"total"`
		Pending    int64 `json:"pending"`
		Processing int64 `json:"processing"`
	} `json:"messages"`
}

type queuesBody struct {
	Queues     []queueItemBody `json:"queues"`
	Pagination pageBody        `json:"pagination"`
}

type resourceQueueBody struct {
	ID         string  `json:"id"`
	Name       string  `json:"name"`
	Namespace  *string `json:"namespace"`
	Partitions []struct {
		ID            string     `json:"id"`
		Name          string     `json:"name"`
		Stats         countsBody `json:"stats"`
		OldestMessage *string    `json:"oldestMessage"`
		NewestMessage *string    `json:"newestMessage"`
	} `json:"partitions"`
	Totals     countsBody `json:"totals"`
	Pagination pageBody   `json:"pagination"`
}

type partitionGroupBody struct {
	Name        string `json:"name"`
	Cursor      int64  `json:"cursor"`
	Done        int64  `json:"done"`
	Lag         int64  `json:"lag"`
	Pending     int64  `json:"pending"`
	Processing  int64  `json:"processing"`
	DeliveredTo int64  `json:"deliveredTo"`
	Attempts    int    `json:"attempts"`
	Lease       *struct {
		ID        string  `json:"id"`
		Owner     string  `json:"owner"`
		Subject   *string `json:"subject"`
		From      int64   `json:"from"`
		To        int64   `json:"to"`
		ExpiresAt string  `json:"expiresAt"`
		Live      bool    `json:"live"`
	} `json:"lease"`
}

type partitionsBody struct {
	Queue      string `json:"queue"`
	Partitions []struct {
		ID         string               `json:"id"`
		Name       string               `json:"name"`
		LastOffset int64                `json:"lastOffset"`
		Messages   countsBody           `json:"messages"`
		Groups     []partitionGroupBody `json:"groups"`
	} `json:"partitions"`
	Pagination struct {
		Limit  int     `json:"limit"`
		Offset int     `json:"offset"`
		After  *string `json:"after"`
		Next   *string `json:"next"`
		Total  int64   `json:"total"`
	} `json:"pagination"`
}

type listedMessage struct {
	ID            string  `json:"id"`
	TransactionID string  `json:"transactionId"`
	PartitionID   string  `json:"partitionId"`
	QueuePath     string  `json:"queuePath"`
	Queue         string  `json:"queue"`
	Partition     string  `json:"partition"`
	Namespace     *string `json:"namespace"`
	Task          *string `json:"task"`
	Status        string  `json:"status"`
	QueueStatus   *string `json:"queueStatus"`
	BusStatus     struct {
		ConsumedBy  int `json:"consumedBy"`
		TotalGroups int `json:"totalGroups"`
	} `json:"busStatus"`
	CreatedAt      string  `json:"createdAt"`
	LeaseExpiresAt *string `json:"leaseExpiresAt"`
}

type messagesBody struct {
	Messages []listedMessage `json:"messages"`
	Mode     struct {
		HasQueueMode   bool   `json:"hasQueueMode"`
		BusGroupsCount int    `json:"busGroupsCount"`
		Type           string `json:"type"`
	} `json:"mode"`
	Pagination struct {
		Limit  int `json:"limit"`
		Offset int `json:"offset"`
	} `json:"pagination"`
}

type messageBody struct {
	listedMessage
	Payload      json.RawMessage `json:"payload"`
	IsEncrypted  bool            `json:"isEncrypted"`
	ErrorMessage *string         `json:"errorMessage"`
	RetryCount   *int            `json:"retryCount"`
	QueueConfig  struct {
		LeaseTime  int `json:"leaseTime"`
		RetryLimit int `json:"retryLimit"`
	} `json:"queueConfig"`
	Mode struct {
		HasQueueMode     bool   `json:"hasQueueMode"`
		BusGroupsCount   int    `json:"busGroupsCount"`
		ConsumedByGroups int    `json:"consumedByGroups"`
		Type             string `json:"type"`
	} `json:"mode"`
	ConsumerGroups []struct {
		Name           string  `json:"name"`
		Consumed       bool    `json:"consumed"`
		Status         string  `json:"status"`
		LeaseExpiresAt *string `json:"leaseExpiresAt"`
	} `json:"consumerGroups"`
}

// getJSON GETs path, expects 200 and decodes the answer into v.
func getJSON[T any](e *env, path string) T {
	e.t.Helper()
	r := e.get(path)
	require.Equal(e.t, http.StatusOK, r.status, "GET %s: %s", path, r)
	assert.Equal(e.t, "application/json", r.header.Get("Content-Type"))
	var v T
	require.NoError(e.t, json.Unmarshal(r.body, &v), "%s", r.body)
	return v
}

// milli is the reference server's admin timestamp.
var milli = `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`

func statuses(msgs []listedMessage) map[string]string {
	out := map[string]string{}
	for _, m := range msgs {
		out[m.TransactionID] = m.Status
	}
	return out
}

func txids(msgs []listedMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.TransactionID
	}
	return out
}

// pushTx pushes payloads with the given transaction ids, in order, to a
// partition of a queue.
func (e *env) pushTx(q, partition string, ids ...string) []pushResult {
	e.t.Helper()
	items := make([]string, len(ids))
	for i, id := range ids {
		items[i] = fmt.Sprintf(`{"queue":%q,"partition":%q,"transactionId":%q,"payload":{"id":%q}}`, q, partition, id, id)
	}
	return e.pushItems("[" + strings.Join(items, ",") + "]")
}

// Every read answers 200 with a body on an empty server (the reference
// server answers some with no body at all).
func TestBrowse_EmptyServerAnswersBodies(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for path, want := range map[string]string{
		"/api/v1/resources/namespaces":   `{"namespaces":[]}`,
		"/api/v1/resources/tasks":        `{"tasks":[]}`,
		"/api/v1/resources/queues":       `{"queues":[],"pagination":{"limit":1000,"offset":0,"total":0}}`,
		"/api/v1/status/queues":          `{"queues":[],"pagination":{"limit":100,"offset":0,"total":0}}`,
		"/api/v1/messages":               `{"messages":[],"mode":{"hasQueueMode":false,"busGroupsCount":0,"type":"none"},"pagination":{"limit":200,"offset":0}}`,
		"/api/v1/status/buffers":         `{"pending":0,"failed":0,"dbHealthy":true,"worker":0}`,
		"/api/v1/resources/overview":     "",
		"/api/v1/status":                 "",
		"/api/v1/status/analytics":       "",
		"/api/v1/messages?status=failed": "",
	} {
		r := e.get(path)
		if path == "/api/v1/messages?status=failed" {
			assertError(t, r, http.StatusBadRequest, "status must be pending, processing, completed or dead_letter")
			continue
		}
		require.Equal(t, http.StatusOK, r.status, "%s: %s", path, r)
		require.NotEmpty(t, r.body, path)
		if want != "" {
			assert.JSONEq(t, want, string(r.body), path)
		}
	}
	ov := object(t, e.get("/api/v1/resources/overview").body)
	assert.Equal(t, []string{"queues", "partitions", "namespaces", "tasks", "messages", "lag", "throughput", "timestamp", "statsAge"},
		keys(t, e.get("/api/v1/resources/overview").body))
	assert.JSONEq(t, `{"total":0,"pending":0,"processing":0,"completed":0,"failed":0,"deadLetter":0}`, string(ov["messages"]))
	assert.Equal(t, []string{"timeRange", "bucketMinutes", "pointCount", "throughput", "queues", "messages", "leases",
		"deadLetterQueue", "workers", "errors", "statsAge"}, keys(t, e.get("/api/v1/status").body))
}

// The resources routes: figures per queue, namespace and task; a queue's
// partitions paged; 404 and 400.
func TestBrowse_Resources(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	require.Equal(t, http.StatusOK, e.post("/api/v1/configure", `{"queue":"billing.invoices","namespace":"billing","task":"invoices"}`).status)
	e.pushTx("billing.invoices", "eu", "i1", "i2", "i3")
	e.pushTx("billing.invoices", "us", "i4")
	e.pushTx("plain", "Default", "p1", "p2")
	// Queue mode takes two messages of eu and finishes one.
	p := e.pop("/api/v1/pop/queue/billing.invoices/partition/eu?batch=2")
	require.Len(t, p.Messages, 2)
	e.ack(p.Messages[0], "completed", "")

	ov := getJSON[struct {
		Queues, Namespaces, Tasks int
		Partitions                int64
		Messages                  countsBody
		Lag                       struct{ Offset struct{ Max float64 } }
		Throughput                struct{ IngestedPerSecond float64 }
		Timestamp                 string
	}](e, "/api/v1/resources/overview")
	assert.Equal(t, 2, ov.Queues)
	assert.Equal(t, int64(4), ov.Partitions, "Default (configure), eu, us; plain's Default")
	assert.Equal(t, 1, ov.Namespaces)
	assert.Equal(t, 1, ov.Tasks)
	assert.Equal(t, countsBody{Total: 6, Pending: 4, Processing: 1, Completed: 1}, ov.Messages)
	assert.Equal(t, float64(2), ov.Lag.Offset.Max, "eu: 2 and 3 unfinished")
	assert.InDelta(t, 6.0/60, ov.Throughput.IngestedPerSecond, 1e-9, "six pushes in the last minute")
	assert.Regexp(t, milli, ov.Timestamp)

	ns := e.get("/api/v1/resources/namespaces")
	assert.JSONEq(t, `{"namespaces":[{"namespace":"billing","queues":1,"partitions":3,"messages":{"total":4,"pending":2}}]}`, string(ns.body))
	assert.JSONEq(t, `{"tasks":[{"task":"invoices","queues":1,"partitions":3,"messages":{"total":4,"pending":2}}]}`,
		string(e.get("/api/v1/resources/tasks").body))

	qs := getJSON[queuesBody](e, "/api/v1/resources/queues")
	require.Len(t, qs.Queues, 2)
	assert.Equal(t, "plain", qs.Queues[0].Name, "newest first")
	assert.Equal(t, "billing.invoices", qs.Queues[1].Name)
	assert.Equal(t, "billing", *qs.Queues[1].Namespace)
	assert.Nil(t, qs.Queues[0].Namespace)
	assert.Equal(t, int64(3), qs.Queues[1].Partitions)
	assert.Equal(t, int64(4), qs.Queues[1].Messages.Total)
	assert.Equal(t, int64(2), qs.Queues[1].Messages.Pending, "i3 and i4; i2 is processing")
	assert.Equal(t, int64(1), qs.Queues[1].Messages.Processing)
	assert.Regexp(t, milli, qs.Queues[1].CreatedAt)
	assert.Equal(t, pageBody{Limit: 1000, Offset: 0, Total: 2}, qs.Pagination)
	// limit, offset and search are honoured.
	page := getJSON[queuesBody](e, "/api/v1/resources/queues?limit=1&offset=1")
	require.Len(t, page.Queues, 1)
	assert.Equal(t, "billing.invoices", page.Queues[0].Name)
	assert.Equal(t, pageBody{Limit: 1, Offset: 1, Total: 2}, page.Pagination)
	assert.Empty(t, getJSON[queuesBody](e, "/api/v1/resources/queues?offset=5").Queues)
	found := getJSON[queuesBody](e, "/api/v1/resources/queues?search=INVOICE")
	require.Len(t, found.Queues, 1)
	assert.Equal(t, int64(1), found.Pagination.Total)
	assert.Len(t, getJSON[queuesBody](e, "/api/v1/resources/queues?namespace=billing").Queues, 1)

	q := getJSON[resourceQueueBody](e, "/api/v1/resources/queues/billing.invoices")
	assert.Equal(t, "billing.invoices", q.Name)
	assert.Equal(t, countsBody{Total: 4, Pending: 2, Processing: 1, Completed: 1}, q.Totals)
	require.Len(t, q.Partitions, 3)
	assert.Equal(t, []string{"Default", "eu", "us"}, []string{q.Partitions[0].Name, q.Partitions[1].Name, q.Partitions[2].Name})
	assert.Equal(t, countsBody{Total: 3, Pending: 1, Processing: 1, Completed: 1}, q.Partitions[1].Stats)
	assert.Nil(t, q.Partitions[0].OldestMessage, "Default holds nothing")
	assert.Regexp(t, milli, *q.Partitions[1].OldestMessage)
	assert.Equal(t, pageBody{Limit: 1000, Offset: 0, Total: 3}, q.Pagination)
	assert.Equal(t, []string{"id", "name", "namespace", "task", "createdAt", "partitions", "totals", "pagination"},
		keys(t, e.get("/api/v1/resources/queues/billing.invoices").body))
	one := getJSON[resourceQueueBody](e, "/api/v1/resources/queues/billing.invoices?limit=1&offset=1")
	require.Len(t, one.Partitions, 1)
	assert.Equal(t, "eu", one.Partitions[0].Name)
	assert.Equal(t, q.Totals, one.Totals, "totals cover every partition, whatever the page")

	assertError(t, e.get("/api/v1/resources/queues/nope"), http.StatusNotFound, "Queue not found")
	for _, bad := range []string{"limit=0", "limit=1001", "limit=x", "offset=-1", "offset=100001"} {
		r := e.get("/api/v1/resources/queues?" + bad)
		assert.Equal(t, http.StatusBadRequest, r.status, "%s: %s", bad, r)
		r = e.get("/api/v1/resources/queues/billing.invoices?" + bad)
		assert.Equal(t, http.StatusBadRequest, r.status, "%s: %s", bad, r)
	}
	assertError(t, e.get("/api/v1/resources/queues?limit=0"), http.StatusBadRequest, "limit must be an integer between 1 and 1000")
}

// Herald's partitions route: a queue's partitions by name, paged by offset
// or keyset, searchable, with each group's cursor, lag and lease.
func TestBrowse_Partitions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 12 {
		e.pushTx("many", fmt.Sprintf("p%02d", i), fmt.Sprintf("m%d", i))
	}
	e.pushTx("many", "p03", "m3b")
	p := e.pop("/api/v1/pop/queue/many/partition/p03?batch=1")
	require.Len(t, p.Messages, 1)

	all := getJSON[partitionsBody](e, "/api/v1/resources/partitions?queue=many")
	assert.Equal(t, "many", all.Queue)
	require.Len(t, all.Partitions, 12)
	assert.Equal(t, int64(12), all.Pagination.Total)
	assert.Equal(t, 100, all.Pagination.Limit)
	assert.Nil(t, all.Pagination.Next, "the last page")
	p3 := all.Partitions[3]
	assert.Equal(t, "p03", p3.Name)
	assert.Equal(t, int64(2), p3.LastOffset)
	assert.Equal(t, countsBody{Total: 2, Pending: 1, Processing: 1}, p3.Messages)
	require.Len(t, p3.Groups, 1)
	g := p3.Groups[0]
	assert.Equal(t, queue.DefaultGroup, g.Name)
	assert.Equal(t, int64(2), g.Lag)
	assert.Equal(t, int64(1), g.Processing)
	assert.Equal(t, int64(1), g.Pending)
	assert.Equal(t, int64(1), g.DeliveredTo)
	require.NotNil(t, g.Lease)
	assert.Equal(t, p.LeaseID, g.Lease.ID)
	assert.True(t, g.Lease.Live)
	assert.Equal(t, "test#pop", g.Lease.Owner, "an HTTP pop's lease: its client holds it, popped through instance test")
	assert.Regexp(t, milli, g.Lease.ExpiresAt)
	assert.Nil(t, all.Partitions[0].Groups[0].Lease)

	// Keyset: next names the last partition of a full page.
	first := getJSON[partitionsBody](e, "/api/v1/resources/partitions?queue=many&limit=5")
	require.Len(t, first.Partitions, 5)
	require.NotNil(t, first.Pagination.Next)
	assert.Equal(t, "p04", *first.Pagination.Next)
	second := getJSON[partitionsBody](e, "/api/v1/resources/partitions?queue=many&limit=5&after="+*first.Pagination.Next)
	assert.Equal(t, "p05", second.Partitions[0].Name)
	assert.Equal(t, "p04", *second.Pagination.After)
	byOffset := getJSON[partitionsBody](e, "/api/v1/resources/partitions?queue=many&limit=5&offset=5")
	assert.Equal(t, second.Partitions[0].ID, byOffset.Partitions[0].ID)
	found := getJSON[partitionsBody](e, "/api/v1/resources/partitions?queue=many&search=P1")
	require.Len(t, found.Partitions, 2)
	assert.Equal(t, int64(2), found.Pagination.Total, "p10 and p11")

	assertError(t, e.get("/api/v1/resources/partitions"), http.StatusBadRequest, "queue is required")
	assertError(t, e.get("/api/v1/resources/partitions?queue=nope"), http.StatusNotFound, "Queue not found")
	assert.Equal(t, http.StatusBadRequest, e.get("/api/v1/resources/partitions?queue=many&limit=1001").status)
}

// Message states as Herald computes them over every group of the
// partition (the group furthest behind decides), in the listing, its
// filters, the one message read and the figures.
func TestBrowse_MessageStates(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.pushTx("st", "Default", "a", "b", "c", "d")
	// Queue mode: a finished, b leased; the bus group: a and b leased.
	qm := e.pop("/api/v1/pop/queue/st?batch=2")
	require.Len(t, qm.Messages, 2)
	e.ack(qm.Messages[0], "completed", "")
	bus := e.pop("/api/v1/pop/queue/st?batch=2&consumerGroup=bus")
	require.Len(t, bus.Messages, 2)
	e.ack(bus.Messages[0], "completed", "")

	list := getJSON[messagesBody](e, "/api/v1/messages?queue=st")
	assert.Equal(t, []string{"d", "c", "b", "a"}, txids(list.Messages), "newest first")
	assert.Equal(t, map[string]string{"a": "completed", "b": "processing", "c": "pending", "d": "pending"}, statuses(list.Messages))
	assert.Equal(t, "hybrid", list.Mode.Type)
	assert.True(t, list.Mode.HasQueueMode)
	assert.Equal(t, 1, list.Mode.BusGroupsCount)
	b := list.Messages[2]
	assert.Equal(t, "processing", *b.QueueStatus)
	assert.Equal(t, 0, b.BusStatus.ConsumedBy)
	assert.Equal(t, 1, b.BusStatus.TotalGroups)
	require.NotNil(t, b.LeaseExpiresAt)
	assert.Regexp(t, milli, *b.LeaseExpiresAt)
	assert.Equal(t, "st/Default", b.QueuePath)
	assert.Regexp(t, milli, b.CreatedAt)
	assert.NotContains(t, string(e.get("/api/v1/messages?queue=st").body), "payload", "no payloads in a listing")

	// The bus group dead-letters b: dead_letter comes first.
	r := e.post("/api/v1/ack", fmt.Sprintf(`{"transactionId":"b","partitionId":%q,"leaseId":%q,"status":"dlq","consumerGroup":"bus","error":"poison"}`,
		bus.Messages[1].PartitionID, bus.Messages[1].LeaseID))
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	for status, want := range map[string][]string{
		"pending": {"d", "c"}, "processing": {}, "completed": {"a"}, "dead_letter": {"b"},
	} {
		got := getJSON[messagesBody](e, "/api/v1/messages?queue=st&status="+status)
		assert.Equal(t, want, txids(got.Messages), status)
	}
	d := getJSON[messageBody](e, "/api/v1/messages/"+qm.PartitionID+"/b")
	assert.Equal(t, "dead_letter", d.Status)
	assert.Equal(t, "poison", *d.ErrorMessage)
	assert.Equal(t, 0, *d.RetryCount)
	assert.JSONEq(t, `{"id":"b"}`, string(d.Payload))
	assert.Equal(t, "hybrid", d.Mode.Type)
	assert.Equal(t, 1, d.Mode.ConsumedByGroups, "the bus group is done with it")
	require.Len(t, d.ConsumerGroups, 2)
	assert.Equal(t, "__QUEUE_MODE__", d.ConsumerGroups[0].Name)
	assert.Equal(t, "processing", d.ConsumerGroups[0].Status)
	assert.False(t, d.ConsumerGroups[0].Consumed)
	assert.NotNil(t, d.ConsumerGroups[0].LeaseExpiresAt)
	assert.Equal(t, "bus", d.ConsumerGroups[1].Name)
	assert.Equal(t, "dead_letter", d.ConsumerGroups[1].Status)
	assert.True(t, d.ConsumerGroups[1].Consumed)

	// Both groups finish everything: completed, and the figures agree.
	e.ack(qm.Messages[1], "completed", "")
	for _, g := range []string{"", "&consumerGroup=bus"} {
		rest := e.pop("/api/v1/pop/queue/st?batch=10" + g)
		for _, m := range rest.Messages {
			e.ack(m, "completed", "")
		}
	}
	assert.Equal(t, map[string]string{"a": "completed", "b": "dead_letter", "c": "completed", "d": "completed"},
		statuses(getJSON[messagesBody](e, "/api/v1/messages?queue=st").Messages))
	q := getJSON[resourceQueueBody](e, "/api/v1/resources/queues/st")
	assert.Equal(t, countsBody{Total: 4, Completed: 4, DeadLetter: 1}, q.Totals)
}

// The listing's filters and paging.
func TestBrowse_MessageFilters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	require.Equal(t, http.StatusOK, e.post("/api/v1/configure", `{"queue":"f1","namespace":"ns1","task":"t1"}`).status)
	e.pushTx("f1", "x", "x1", "x2")
	e.pushTx("f1", "y", "y1")
	e.pushTx("f2", "x", "z1", "z2", "z3")
	all := getJSON[messagesBody](e, "/api/v1/messages")
	assert.Equal(t, []string{"z3", "z2", "z1", "y1", "x2", "x1"}, txids(all.Messages))
	assert.Equal(t, "none", all.Mode.Type, "nobody consumes")
	assert.Equal(t, "ns1", *all.Messages[3].Namespace)
	assert.Nil(t, all.Messages[0].Namespace)

	for query, want := range map[string][]string{
		"queue=f1":                  {"y1", "x2", "x1"},
		"queue=f1&partition=x":      {"x2", "x1"},
		"partition=x":               {"z3", "z2", "z1", "x2", "x1"},
		"ns=ns1":                    {"y1", "x2", "x1"},
		"task=t1&queue=f1":          {"y1", "x2", "x1"},
		"task=t2":                   {},
		"queue=nope":                {},
		"limit=2":                   {"z3", "z2"},
		"limit=2&offset=2":          {"z1", "y1"},
		"limit=2&offset=5":          {"x1"},
		"offset=6":                  {},
		"status=pending&limit=3":    {"z3", "z2", "z1"},
		"to=2000-01-01T00:00:00Z":   {},
		"from=2000-01-01T00:00:00Z": {"z3", "z2", "z1", "y1", "x2", "x1"},
	} {
		got := getJSON[messagesBody](e, "/api/v1/messages?"+query)
		assert.Equal(t, want, txids(got.Messages), query)
	}
	// A window after the pushes is empty; one around them holds them all.
	future := url.QueryEscape(time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano))
	assert.Empty(t, getJSON[messagesBody](e, "/api/v1/messages?from="+future+"&to="+
		url.QueryEscape(time.Now().Add(time.Hour).UTC().Format(time.RFC3339))).Messages)
	assert.Len(t, getJSON[messagesBody](e, "/api/v1/messages?to="+future).Messages, 6)
	paged := getJSON[messagesBody](e, "/api/v1/messages?limit=2&offset=2")
	assert.Equal(t, 2, paged.Pagination.Limit)
	assert.Equal(t, 2, paged.Pagination.Offset)

	for query, msg := range map[string]string{
		"limit=0":        "limit must be an integer between 1 and 1000",
		"limit=1001":     "limit must be an integer between 1 and 1000",
		"offset=-1":      "offset must be an integer between 0 and 100000",
		"from=yesterday": "from must be an RFC 3339 time (2026-01-05T10:00:00.000Z)",
		"to=2026-13-01":  "to must be an RFC 3339 time (2026-01-05T10:00:00.000Z)",
		"status=done":    "status must be pending, processing, completed or dead_letter",
		"from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z": "from must be before to",
	} {
		assertError(t, e.get("/api/v1/messages?"+query), http.StatusBadRequest, msg)
	}
	assert.Equal(t, http.StatusBadRequest, e.get("/api/v1/messages?queue="+strings.Repeat("q", 300)).status)
}

// One message with its payload; from an encrypted queue, decrypted as a
// pop decrypts it; 404 and 400.
func TestBrowse_MessageRead(t *testing.T) {
	t.Parallel()
	base := queuetest.NewStore(t)
	store, err := queue.New(queue.Config{Pool: base.Pool(), EncryptionKey: bytes.Repeat([]byte{7}, 32)})
	require.NoError(t, err)
	e := newEnvOn(t, store, nil)
	require.Equal(t, http.StatusOK, e.post("/api/v1/configure", `{"queue":"secret","options":{"encryptionEnabled":true,"leaseTime":60}}`).status)
	res := e.pushTx("secret", "Default", "s1")
	var stored string
	require.NoError(t, store.Pool().QueryRow(ctxT(t), `SELECT payload::text FROM messages`).Scan(&stored))
	require.Contains(t, stored, "$herald_enc", "stored encrypted")

	m := getJSON[messageBody](e, "/api/v1/messages/"+res[0].PartitionID+"/s1")
	assert.JSONEq(t, `{"id":"s1"}`, string(m.Payload))
	assert.True(t, m.IsEncrypted)
	assert.Equal(t, "pending", m.Status)
	assert.Equal(t, res[0].MessageID, m.ID)
	assert.Equal(t, 60, m.QueueConfig.LeaseTime)
	assert.Equal(t, "none", m.Mode.Type)
	assert.Empty(t, m.ConsumerGroups)
	assert.Nil(t, m.ErrorMessage)
	assert.Nil(t, m.RetryCount)
	assert.Equal(t, []string{"id", "transactionId", "partitionId", "queuePath", "queue", "partition", "namespace", "task",
		"status", "payload", "isEncrypted", "traceId", "producerSub", "createdAt", "errorMessage", "retryCount",
		"leaseExpiresAt", "queueConfig", "mode", "consumerGroups"}, keys(t, e.get("/api/v1/messages/"+res[0].PartitionID+"/s1").body))

	assertError(t, e.get("/api/v1/messages/"+res[0].PartitionID+"/nope"), http.StatusNotFound, "Message not found")
	assertError(t, e.get("/api/v1/messages/"+queue.NewID()+"/s1"), http.StatusNotFound, "Message not found")
	assertError(t, e.get("/api/v1/messages/not-a-uuid/s1"), http.StatusBadRequest, "partitionId must be a UUID")
	assertError(t, e.do(http.MethodDelete, "/api/v1/messages/not-a-uuid/s1", ""), http.StatusBadRequest, "partitionId must be a UUID")
	// A transaction id with a slash, percent-encoded as clients send it.
	slash := e.pushTx("secret", "Default", "a/b")
	got := getJSON[messageBody](e, "/api/v1/messages/"+slash[0].PartitionID+"/"+url.PathEscape("a/b"))
	assert.Equal(t, "a/b", got.TransactionID)
}

// Deleting a message while a group holds it under a lease and
// another group has not reached it. The delete counts as finished for
// every group: the holder's other acks end the lease, the next pop goes
// on after it, the other group skips it.
func TestBrowse_DeleteMessageUnderALiveGroup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	res := e.pushTx("del", "Default", "m1", "m2", "m3", "m4")
	pid := res[0].PartitionID
	e.popEmpty("/api/v1/pop/queue/del?consumerGroup=bus&subscriptionMode=new") // registers bus at the end
	e.pushTx("del", "Default", "m5")
	held := e.pop("/api/v1/pop/queue/del?batch=3")
	require.Equal(t, []string{"m1", "m2", "m3"}, []string{held.Messages[0].TransactionID, held.Messages[1].TransactionID,
		held.Messages[2].TransactionID})

	r := e.do(http.MethodDelete, "/api/v1/messages/"+pid+"/m2", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Equal(t, `{"success":true,"partitionId":"`+pid+`","transactionId":"m2","message":"Message deleted successfully"}`, string(r.body))
	assertError(t, e.do(http.MethodDelete, "/api/v1/messages/"+pid+"/m2", ""), http.StatusNotFound, "Message not found")
	assertError(t, e.get("/api/v1/messages/"+pid+"/m2"), http.StatusNotFound, "Message not found")

	// The holder acks what it has: m2 is gone, m1 and m3 end the lease.
	assert.True(t, e.ack(held.Messages[0], "completed", "").Success)
	gone := e.ack(held.Messages[1], "completed", "")
	assert.False(t, gone.Success)
	assert.Equal(t, "Message not found", *gone.Error)
	last := e.ack(held.Messages[2], "completed", "")
	assert.True(t, last.Success)
	assert.True(t, last.LeaseReleased)

	next := e.pop("/api/v1/pop/queue/del?batch=10")
	assert.Equal(t, []string{"m4", "m5"}, []string{next.Messages[0].TransactionID, next.Messages[1].TransactionID})
	for _, m := range next.Messages {
		e.ack(m, "completed", "")
	}
	parts := getJSON[partitionsBody](e, "/api/v1/resources/partitions?queue=del")
	require.Len(t, parts.Partitions, 1)
	for _, g := range parts.Partitions[0].Groups {
		if g.Name == queue.DefaultGroup {
			assert.Equal(t, partitionGroupBody{Name: g.Name, Cursor: 5, DeliveredTo: 5}, g, "caught up past the hole")
		}
	}
	// Deleting m5, the only message the bus group waits for, leaves it
	// nothing to wait for.
	require.Equal(t, http.StatusOK, e.do(http.MethodDelete, "/api/v1/messages/"+pid+"/m5", "").status)
	e.popEmpty("/api/v1/pop/queue/del?consumerGroup=bus")
	q := getJSON[resourceQueueBody](e, "/api/v1/resources/queues/del")
	assert.Equal(t, countsBody{Total: 5, Completed: 5}, q.Totals, "deleted messages count as finished")
	assert.Equal(t, []string{"m4", "m3", "m1"}, txids(getJSON[messagesBody](e, "/api/v1/messages?queue=del").Messages))
}

// A WebSocket subscription holding a message that is deleted gets its
// credit back: with maxInFlight 1 it is delivered the next message.
func TestBrowse_DeleteGivesAStreamItsCreditBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	res := e.pushTx("credit", "Default", "c1", "c2")
	c := e.dialWS(t)
	c.subscribe(`{"type":"subscribe","queue":"credit","batch":1,"maxInFlight":1}`)
	first := deliveredMessages(t, c.next("deliver"))
	require.Len(t, first, 1)
	assert.Equal(t, "c1", first[0].TransactionID)
	require.Equal(t, http.StatusOK, e.do(http.MethodDelete, "/api/v1/messages/"+res[0].PartitionID+"/c1", "").status)
	second := deliveredMessages(t, c.next("deliver"))
	require.Len(t, second, 1)
	assert.Equal(t, "c2", second[0].TransactionID)
}

// The status routes.
func TestBrowse_Status(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	require.Equal(t, http.StatusOK, e.post("/api/v1/configure", `{"queue":"orders","namespace":"shop","options":{"leaseTime":90,"maxSize":500,"deadLetterQueue":true}}`).status)
	e.pushTx("orders", "eu", "o1", "o2", "o3")
	e.pushTx("other", "Default", "x1")
	p := e.pop("/api/v1/pop/queue/orders/partition/eu?batch=2")
	require.Len(t, p.Messages, 2)
	r := e.post("/api/v1/ack", fmt.Sprintf(`{"transactionId":"o1","partitionId":%q,"leaseId":%q,"status":"dlq","error":"boom"}`,
		p.PartitionID, p.LeaseID))
	require.Equal(t, http.StatusOK, r.status)

	st := getJSON[struct {
		TimeRange     struct{ From, To string }
		BucketMinutes int
		Throughput    []any
		Queues        []struct {
			Name          string
			Partitions    int64
			TotalConsumed int64
		}
		Messages struct {
			countsBody
			Requests map[string]int64
		}
		Leases struct {
			Active, PartitionsWithLeases, TotalBatchSize, TotalAcked int64
		}
		DeadLetterQueue struct {
			TotalMessages, AffectedPartitions int64
			TopErrors                         []struct {
				Error string
				Count int64
			}
		}
		Workers []any
		Errors  struct{ DLQMessages int64 }
	}](e, "/api/v1/status")
	assert.Regexp(t, milli, st.TimeRange.From)
	assert.Equal(t, 1, st.BucketMinutes)
	assert.NotEmpty(t, st.Throughput, "this instance's history (TestStatus_ThroughputAndWorkersComeFromTheHistory checks its figures)")
	assert.Len(t, st.Workers, 1, "this instance")
	assert.Len(t, st.Queues, 2)
	assert.Equal(t, countsBody{Total: 4, Pending: 2, Processing: 1, Completed: 1, DeadLetter: 1}, st.Messages.countsBody)
	assert.Equal(t, int64(1), st.Leases.Active)
	assert.Equal(t, int64(2), st.Leases.TotalBatchSize)
	assert.Equal(t, int64(1), st.Leases.TotalAcked, "o1, dead-lettered")
	assert.Equal(t, int64(1), st.DeadLetterQueue.TotalMessages)
	assert.Equal(t, int64(1), st.DeadLetterQueue.AffectedPartitions)
	require.Len(t, st.DeadLetterQueue.TopErrors, 1)
	assert.Equal(t, "boom", st.DeadLetterQueue.TopErrors[0].Error)
	assert.Equal(t, int64(1), st.Errors.DLQMessages)
	one := getJSON[struct{ Queues []struct{ Name string } }](e, "/api/v1/status?queue=other")
	require.Len(t, one.Queues, 1)
	assert.Equal(t, 5, getJSON[struct{ BucketMinutes int }](e, "/api/v1/status?from="+
		url.QueryEscape(time.Now().Add(-3*time.Hour).UTC().Format(time.RFC3339))).BucketMinutes)

	sq := getJSON[queuesBody](e, "/api/v1/status/queues?namespace=shop")
	require.Len(t, sq.Queues, 1)
	assert.Equal(t, int64(2), sq.Queues[0].Messages.Pending, "o2 (processing) and o3: pending counts the leased too here")
	assert.Equal(t, pageBody{Limit: 100, Offset: 0, Total: 1}, sq.Pagination)
	assert.Len(t, getJSON[queuesBody](e, "/api/v1/status/queues?limit=1&offset=1").Queues, 1)

	detail := e.get("/api/v1/status/queues/orders")
	require.Equal(t, http.StatusOK, detail.status)
	var d struct {
		Queue struct {
			Name      string
			Namespace *string
			Config    struct {
				LeaseTime, MaxQueueSize int
				DeadLetterQueue         bool
			}
		}
		Partitions []struct {
			Name     string
			Messages countsBody
			Stats    countsBody
			Cursor   struct{ TotalConsumed int64 }
		}
		Totals struct {
			Messages countsBody
			countsBody
		}
	}
	require.NoError(t, json.Unmarshal(detail.body, &d))
	assert.Equal(t, []string{"queue", "partitions", "totals", "pagination"}, keys(t, detail.body))
	assert.Equal(t, "shop", *d.Queue.Namespace)
	assert.Equal(t, 90, d.Queue.Config.LeaseTime)
	assert.Equal(t, 500, d.Queue.Config.MaxQueueSize)
	assert.True(t, d.Queue.Config.DeadLetterQueue)
	want := countsBody{Total: 3, Pending: 1, Processing: 1, Completed: 1, DeadLetter: 1}
	assert.Equal(t, want, d.Totals.Messages)
	assert.Equal(t, want, d.Totals.countsBody)
	require.Len(t, d.Partitions, 2, "Default and eu")
	assert.Equal(t, want, d.Partitions[1].Stats)
	assert.Equal(t, int64(1), d.Partitions[1].Cursor.TotalConsumed)
	assertError(t, e.get("/api/v1/status/queues/nope"), http.StatusNotFound, "Queue not found")

	msgs := e.get("/api/v1/status/queues/orders/messages")
	require.Equal(t, http.StatusOK, msgs.status)
	var arr []struct{ TransactionID, Status, QueuePath string }
	require.NoError(t, json.Unmarshal(msgs.body, &arr))
	require.Len(t, arr, 3)
	assert.Equal(t, "o3", arr[0].TransactionID)
	assert.Equal(t, "dead_letter", arr[2].Status)
	assert.Equal(t, "orders/eu", arr[0].QueuePath)
	assert.Len(t, array(t, e.get("/api/v1/status/queues/orders/messages?limit=1&offset=2").body), 1)
	assert.Equal(t, "[]", string(e.get("/api/v1/status/queues/orders/messages?offset=3").body))
	assertError(t, e.get("/api/v1/status/queues/nope/messages"), http.StatusNotFound, "Queue not found")

	an := getJSON[struct {
		DataPoints []struct {
			Timestamp string
			Messages  int64
		}
		Interval, From, To string
	}](e, "/api/v1/status/analytics?interval=minute&from="+url.QueryEscape(time.Now().Add(-10*time.Minute).UTC().Format(time.RFC3339)))
	assert.Equal(t, "minute", an.Interval)
	assert.Len(t, an.DataPoints, 11, "every minute of the range, zero-filled")
	var sum int64
	for _, p := range an.DataPoints {
		assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:00Z$`, p.Timestamp)
		sum += p.Messages
	}
	assert.Equal(t, int64(4), sum)
	day := getJSON[struct{ DataPoints []struct{ Messages int64 } }](e, "/api/v1/status/analytics?queue=other")
	require.Len(t, day.DataPoints, 25, "hours of the last 24, the first partial")
	sum = 0
	for _, p := range day.DataPoints {
		sum += p.Messages
	}
	assert.Equal(t, int64(1), sum, "x1 only")
	assertError(t, e.get("/api/v1/status/analytics?interval=week"), http.StatusBadRequest, "interval must be minute, hour or day")
	assert.Equal(t, http.StatusBadRequest, e.get("/api/v1/status/analytics?interval=minute&from=2000-01-01T00:00:00Z").status,
		"too many points")

	assert.JSONEq(t, `{"pending":0,"failed":0,"dbHealthy":true,"worker":0}`, string(e.get("/api/v1/status/buffers").body))
}

// Rights: a token whose herald claim names queues and partitions sees only
// those in lists and figures, and 403 for anything else it names; reads
// need read-only, a delete read-write.
func TestBrowse_Rights(t *testing.T) {
	t.Parallel()
	e := newAuthEnv(t)
	admin := auth.SignToken(authSecret, "ops", "admin", time.Hour)
	push := func(q, part, id string) pushResult {
		r := e.doAuth(http.MethodPost, "/api/v1/push", admin,
			fmt.Sprintf(`{"items":[{"queue":%q,"partition":%q,"transactionId":%q,"payload":{}}]}`, q, part, id))
		require.Equal(t, http.StatusCreated, r.status, "%s", r)
		var out []pushResult
		require.NoError(t, json.Unmarshal(r.body, &out))
		return out[0]
	}
	alicePart := push("mail", "alice", "a1").PartitionID
	push("mail", "alice", "a2")
	bobPart := push("mail", "bob", "b1").PartitionID
	push("news", "Default", "n1")
	push("secret", "Default", "s1")
	alice := mailbox(t, "alice")
	reader := authtest.Sign(t, jwa.HS256(), authSecret, "", map[string]any{"sub": "r", "role": "read-only",
		"exp": time.Now().Add(time.Hour).Unix(), "herald": map[string]any{"consume": []string{"news", "mail/al*"}}})
	get := func(tok, path string) resp { return e.doAuth(http.MethodGet, path, tok, "") }

	// Without a token: 401; a read-only token reads, may not delete.
	assert.Equal(t, http.StatusUnauthorized, get("", "/api/v1/resources/queues").status)
	r := e.doAuth(http.MethodDelete, "/api/v1/messages/"+alicePart+"/a1", reader, "")
	assertError(t, r, http.StatusForbidden, "role read-only may not do this; it needs read-write")

	var qs queuesBody
	require.NoError(t, json.Unmarshal(get(alice, "/api/v1/resources/queues").body, &qs))
	require.Len(t, qs.Queues, 1, "alice sees mail only")
	assert.Equal(t, "mail", qs.Queues[0].Name)
	assert.Equal(t, int64(1), qs.Queues[0].Partitions, "her partition only")
	assert.Equal(t, int64(2), qs.Queues[0].Messages.Total, "her messages only")
	require.NoError(t, json.Unmarshal(get(admin, "/api/v1/resources/queues").body, &qs))
	assert.Len(t, qs.Queues, 3, "the admin's token has no claim: everything")
	require.NoError(t, json.Unmarshal(get(reader, "/api/v1/resources/queues").body, &qs))
	assert.Len(t, qs.Queues, 2, "news and mail")

	var ov struct {
		Queues     int
		Partitions int64
		Messages   countsBody
	}
	require.NoError(t, json.Unmarshal(get(alice, "/api/v1/resources/overview").body, &ov))
	assert.Equal(t, 1, ov.Queues)
	assert.Equal(t, int64(1), ov.Partitions)
	assert.Equal(t, int64(2), ov.Messages.Total)

	var msgs messagesBody
	require.NoError(t, json.Unmarshal(get(alice, "/api/v1/messages").body, &msgs))
	assert.Equal(t, []string{"a2", "a1"}, txids(msgs.Messages))
	require.NoError(t, json.Unmarshal(get(reader, "/api/v1/messages?queue=mail").body, &msgs))
	assert.Equal(t, []string{"a2", "a1"}, txids(msgs.Messages), "mail/al* covers alice, not bob")
	var parts partitionsBody
	require.NoError(t, json.Unmarshal(get(alice, "/api/v1/resources/partitions?queue=mail").body, &parts))
	require.Len(t, parts.Partitions, 1)
	assert.Equal(t, "alice", parts.Partitions[0].Name)
	assert.Equal(t, int64(1), parts.Pagination.Total)
	var rq resourceQueueBody
	require.NoError(t, json.Unmarshal(get(alice, "/api/v1/resources/queues/mail").body, &rq))
	assert.Len(t, rq.Partitions, 1)
	assert.Equal(t, int64(2), rq.Totals.Total)
	assert.Equal(t, http.StatusOK, get(alice, "/api/v1/messages/"+alicePart+"/a1").status)

	// Anything else named: 403, before it is looked up.
	for _, path := range []string{
		"/api/v1/resources/queues/news", "/api/v1/resources/queues/nope", "/api/v1/resources/partitions?queue=secret",
		"/api/v1/status/queues/news", "/api/v1/status/queues/news/messages", "/api/v1/messages?queue=news",
		"/api/v1/messages?queue=mail&partition=bob", "/api/v1/status?queue=secret",
		"/api/v1/status/analytics?queue=secret",
	} {
		assert.Equal(t, http.StatusForbidden, get(alice, path).status, path)
	}
	// A message named by its partition's id: as one that does not exist.
	assert.Equal(t, http.StatusNotFound, get(alice, "/api/v1/messages/"+bobPart+"/b1").status)
	r = e.doAuth(http.MethodDelete, "/api/v1/messages/"+bobPart+"/b1", alice, "")
	assertError(t, r, http.StatusNotFound, "Message not found")
	assert.Equal(t, http.StatusOK, get(admin, "/api/v1/messages/"+bobPart+"/b1").status, "still there")
	r = e.doAuth(http.MethodDelete, "/api/v1/messages/"+alicePart+"/a1", alice, "")
	assert.Equal(t, http.StatusOK, r.status, "%s", r)

	var st struct{ Queues []struct{ Name string } }
	require.NoError(t, json.Unmarshal(get(reader, "/api/v1/status").body, &st))
	assert.Len(t, st.Queues, 2)
	var ns struct{ Namespaces []any }
	require.NoError(t, json.Unmarshal(get(alice, "/api/v1/resources/namespaces").body, &ns))
	assert.Empty(t, ns.Namespaces)
}

// GET /api/v1/status/rates counts this instance's pushes and
// acks per queue.
func TestBrowse_StatusRates(t *testing.T) {
	e := newEnv(t)
	e.push("ratesq", `1`, `2`, `3`)
	res := e.pop("/api/v1/pop/queue/ratesq?batch=2&wait=false")
	for _, m := range res.Messages {
		e.ack(m, "completed", "")
	}
	r := e.get("/api/v1/status/rates")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	var out struct {
		IntervalSeconds int `json:"intervalSeconds"`
		Samples         int `json:"samples"`
		Since           string
		Queues          []struct {
			Queue         string
			Pushed, Acked []int64
		}
	}
	require.NoError(t, json.Unmarshal(r.body, &out))
	assert.Equal(t, 10, out.IntervalSeconds)
	assert.Equal(t, 30, out.Samples)
	require.Len(t, out.Queues, 1)
	q := out.Queues[0]
	assert.Equal(t, "ratesq", q.Queue)
	require.Len(t, q.Pushed, 30)
	sum := func(xs []int64) (n int64) {
		for _, x := range xs {
			n += x
		}
		return n
	}
	assert.Equal(t, int64(3), sum(q.Pushed))
	assert.Equal(t, int64(2), sum(q.Acked))
	r = e.get("/api/v1/status/rates?queue=nope")
	assert.Contains(t, string(r.body), `"queues":[]`)
}
