package admin

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

// statusFilter reads the queue, namespace and task of a status read; a
// queue outside the token's rights is 403.
func statusFilter(r *http.Request, q url.Values) (queue.StatusFilter, error) {
	name, err := nameParam(q, "queue", "queue")
	if err != nil {
		return queue.StatusFilter{}, err
	}
	rights := auth.RightsFrom(r.Context())
	if err := checkQueueRead(rights, name); err != nil {
		return queue.StatusFilter{}, err
	}
	return queue.StatusFilter{Queue: name, Namespace: q.Get("namespace"), Task: q.Get("task"), Scope: browseScope(rights)}, nil
}

// bucketMinutes is the reference server's bucket for a window: the longer
// the window, the coarser.
func bucketMinutes(window time.Duration) int {
	switch {
	case window <= time.Hour:
		return 1
	case window <= 6*time.Hour:
		return 5
	case window <= 24*time.Hour:
		return 15
	case window <= 7*24*time.Hour:
		return 60
	}
	return 360
}

type statusQueueJSON struct {
	queueRefJSON
	Partitions    int64 `json:"partitions"`
	TotalConsumed int64 `json:"totalConsumed"`
}

type opsJSON struct {
	Push int64 `json:"push"`
	Pop  int64 `json:"pop"`
	Ack  int64 `json:"ack"`
}

type statusMessagesJSON struct {
	countsJSON
	Requests        opsJSON `json:"requests"`
	BatchEfficiency opsJSON `json:"batchEfficiency"`
}

type errorCountJSON struct {
	Error string `json:"error"`
	Count int64  `json:"count"`
}

type statusJSON struct {
	TimeRange struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"timeRange"`
	BucketMinutes int                `json:"bucketMinutes"`
	PointCount    int                `json:"pointCount"`
	Throughput    []statusPointJSON  `json:"throughput"`
	Queues        []statusQueueJSON  `json:"queues"`
	Messages      statusMessagesJSON `json:"messages"`
	Leases        struct {
		Active               int64 `json:"active"`
		PartitionsWithLeases int64 `json:"partitionsWithLeases"`
		TotalBatchSize       int64 `json:"totalBatchSize"`
		TotalAcked           int64 `json:"totalAcked"`
	} `json:"leases"`
	DeadLetterQueue struct {
		TotalMessages      int64            `json:"totalMessages"`
		AffectedPartitions int64            `json:"affectedPartitions"`
		TopErrors          []errorCountJSON `json:"topErrors"`
	} `json:"deadLetterQueue"`
	Workers []statusWorkerJSON `json:"workers"`
	Errors  struct {
		DBErrors    int64 `json:"dbErrors"`
		AckFailed   int64 `json:"ackFailed"`
		DLQMessages int64 `json:"dlqMessages"`
	} `json:"errors"`
	StatsAge int `json:"statsAge"`
}

// handleStatusDashboard is the dashboard's main view: queues, message
// figures, live leases and dead letters from the database; throughput
// buckets and workers from this instance's history (Deps.History); the
// request counters stay zero.
func (s *service) handleStatusDashboard(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	from, to, err := timeRange(q, time.Hour)
	if err != nil {
		return err
	}
	f, err := statusFilter(r, q)
	if err != nil {
		return err
	}
	list, err := s.Store.BrowseQueues(r.Context(), queue.QueuesQuery{Name: f.Queue, Namespace: f.Namespace, Task: f.Task,
		Scope: f.Scope})
	if err != nil {
		return err
	}
	leases, err := s.Store.BrowseLeases(r.Context(), f)
	if err != nil {
		return err
	}
	dl, err := s.Store.BrowseDeadLetters(r.Context(), f)
	if err != nil {
		return err
	}
	var out statusJSON
	out.TimeRange.From, out.TimeRange.To = httpapi.FormatMilli(from), httpapi.FormatMilli(to)
	out.BucketMinutes = bucketMinutes(to.Sub(from))
	out.Queues = []statusQueueJSON{}
	out.Throughput, out.Workers = s.statusSeries(r, from, to, out.BucketMinutes, f.Queue) // analytics.go
	out.PointCount = len(out.Throughput)
	for _, qs := range list.Queues {
		out.Messages.add(qs.Counts)
		if qs.Counts.Total > 0 {
			out.Queues = append(out.Queues, statusQueueJSON{queueRefJSON: queueRef(qs), Partitions: qs.Partitions, TotalConsumed: qs.Counts.Completed})
		}
	}
	out.Leases.Active, out.Leases.PartitionsWithLeases = leases.Active, leases.Partitions
	out.Leases.TotalBatchSize, out.Leases.TotalAcked = leases.Size, leases.Acked
	out.DeadLetterQueue.TotalMessages, out.DeadLetterQueue.AffectedPartitions = dl.Total, dl.Partitions
	out.DeadLetterQueue.TopErrors = make([]errorCountJSON, len(dl.TopErrors))
	for i, e := range dl.TopErrors {
		out.DeadLetterQueue.TopErrors[i] = errorCountJSON{Error: e.Error, Count: e.Count}
	}
	out.Errors.DLQMessages = dl.Total
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// handleStatusQueues lists queues newest first; pending counts what is
// leased too, as the reference server's does here.
func (s *service) handleStatusQueues(w http.ResponseWriter, r *http.Request) error {
	return s.listQueues(w, r, 100, true)
}

type statusConfigJSON struct {
	LeaseTime       int  `json:"leaseTime"`
	RetryLimit      int  `json:"retryLimit"`
	RetryDelay      int  `json:"retryDelay"`
	TTL             int  `json:"ttl"`
	MaxQueueSize    int  `json:"maxQueueSize"`
	DeadLetterQueue bool `json:"deadLetterQueue"`
}

type statusPartitionJSON struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	CreatedAt string     `json:"createdAt"`
	Messages  countsJSON `json:"messages"`
	Stats     countsJSON `json:"stats"`
	Cursor    struct {
		TotalConsumed   int64 `json:"totalConsumed"`
		BatchesConsumed int64 `json:"batchesConsumed"`
	} `json:"cursor"`
	LastActivity  *string `json:"lastActivity"`
	OldestMessage *string `json:"oldestMessage"`
	NewestMessage *string `json:"newestMessage"`
}

type statusTotalsJSON struct {
	Messages countsJSON `json:"messages"`
	countsJSON
}

type statusQueueDetailJSON struct {
	Queue struct {
		queueRefJSON
		Priority  int              `json:"priority"`
		CreatedAt string           `json:"createdAt"`
		Config    statusConfigJSON `json:"config"`
	} `json:"queue"`
	Partitions []statusPartitionJSON `json:"partitions"`
	Totals     statusTotalsJSON      `json:"totals"`
	Pagination paginationJSON        `json:"pagination"`
}

// handleStatusQueue answers one queue with its settings, totals and a page
// of its partitions (limit ≤ 1000, default 1000).
func (s *service) handleStatusQueue(w http.ResponseWriter, r *http.Request) error {
	page, limit, offset, err := s.partitionPage(r, r.PathValue("queue"), queue.MaxBrowseLimit, false)
	if err != nil {
		return err
	}
	qs, o := page.Queue, page.Options
	var out statusQueueDetailJSON
	out.Queue.queueRefJSON = queueRef(qs)
	out.Queue.Priority, out.Queue.CreatedAt = qs.Priority, httpapi.FormatMilli(qs.CreatedAt)
	out.Queue.Config = statusConfigJSON{LeaseTime: o.LeaseTime, RetryLimit: o.RetryLimit, RetryDelay: o.RetryDelay, TTL: o.TTL,
		MaxQueueSize: o.MaxSize, DeadLetterQueue: o.DeadLetterQueue}
	out.Partitions = make([]statusPartitionJSON, len(page.Partitions))
	for i, p := range page.Partitions {
		pj := statusPartitionJSON{ID: p.ID, Name: p.Name, CreatedAt: httpapi.FormatMilli(p.CreatedAt), Messages: countsOf(p.Counts),
			Stats: countsOf(p.Counts), LastActivity: httpapi.OptTime(p.LastActivity), OldestMessage: httpapi.OptTime(p.Oldest),
			NewestMessage: httpapi.OptTime(p.Newest)}
		pj.Cursor.TotalConsumed = p.Counts.Completed
		out.Partitions[i] = pj
	}
	out.Totals = statusTotalsJSON{Messages: countsOf(qs.Counts), countsJSON: countsOf(qs.Counts)}
	out.Pagination = paginationJSON{Limit: limit, Offset: offset, Total: page.Matching}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

type statusMessageJSON struct {
	messageRefJSON
	Status    string `json:"status"`
	CreatedAt string `json:"createdAt"`
}

// handleStatusQueueMessages answers a bare array of one queue's messages,
// newest first (limit 50, offset), whatever their age.
func (s *service) handleStatusQueueMessages(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("queue")
	if err := queue.ValidateName("queue", name); err != nil {
		return err
	}
	qry, err := messageQuery(r, 50, 0)
	if err != nil {
		return err
	}
	if err := checkQueueRead(auth.RightsFrom(r.Context()), name); err != nil {
		return err
	}
	if _, err := s.Store.QueueID(r.Context(), name); err != nil {
		return err
	}
	qry.Queue = name
	list, err := s.Store.BrowseMessages(r.Context(), qry)
	if err != nil {
		return err
	}
	out := make([]statusMessageJSON, len(list.Messages))
	for i, m := range list.Messages {
		out[i] = statusMessageJSON{messageRefJSON: messageRef(m), Status: m.State, CreatedAt: httpapi.FormatMilli(m.CreatedAt)}
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

type dataPointJSON struct {
	Timestamp string `json:"timestamp"`
	Messages  int64  `json:"messages"`
}

// bucketTime is the reference server's time-series timestamp: seconds.
const bucketTime = "2006-01-02T15:04:05Z"

// handleStatusAnalytics counts stored messages by creation time (minute,
// hour or day buckets, every one of the range present).
func (s *service) handleStatusAnalytics(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	from, to, err := timeRange(q, 24*time.Hour)
	if err != nil {
		return err
	}
	interval := q.Get("interval")
	if interval == "" {
		interval = "hour"
	}
	if _, ok := queue.AnalyticsInterval(interval); !ok {
		return httpapi.BadRequestf("interval must be minute, hour or day")
	}
	f, err := statusFilter(r, q)
	if err != nil {
		return err
	}
	buckets, err := s.Store.BrowseAnalytics(r.Context(), f, from, to, interval)
	if err != nil {
		return err
	}
	points := make([]dataPointJSON, len(buckets))
	for i, b := range buckets {
		points[i] = dataPointJSON{Timestamp: b.Start.UTC().Format(bucketTime), Messages: b.Messages}
	}
	httpapi.WriteJSON(w, http.StatusOK, struct {
		DataPoints []dataPointJSON `json:"dataPoints"`
		Interval   string          `json:"interval"`
		From       string          `json:"from"`
		To         string          `json:"to"`
	}{points, interval, httpapi.FormatMilli(from), httpapi.FormatMilli(to)})
	return nil
}

// handleStatusBuffers answers as the reference server's does for its local
// disk buffer, which Herald has none of: nothing pending or failed; whether
// the database answers now.
func (s *service) handleStatusBuffers(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	healthy := s.Store.Ping(ctx) == nil
	// pending: pushes this instance holds in its maintenance buffer,
	// waiting for the end of push maintenance.
	httpapi.WriteJSON(w, http.StatusOK, struct {
		Pending   int  `json:"pending"`
		Failed    int  `json:"failed"`
		DBHealthy bool `json:"dbHealthy"`
		Worker    int  `json:"worker"`
	}{Pending: s.Maintenance.Buffer().Records, DBHealthy: healthy})
	return nil
}
