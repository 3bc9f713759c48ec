package admin

import (
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

// browseRoutes registers the routes of resources, messages and status reads.
//
// They answer what the reference server's dashboard and admin clients read,
// computed live from partition and consumer rows (queue.BrowseQueues and
// the rest say what each costs). Unlike the reference server they answer
// the status they mean (404, 400) with a body, and honour limit and offset.
// With a token whose rights (the herald claim) name queues and partitions,
// lists show only what it may consume, naming any other queue or partition
// is 403, and a message of another partition (named by the partition's
// id) is not found, as one that does not exist (see gateway/authorize.go).
func (s *service) browseRoutes() {
	s.routes.Read("GET /api/v1/resources/overview", "resources_overview", auth.RoleReadOnly, s.handleOverview)
	s.routes.Read("GET /api/v1/resources/namespaces", "resources_namespaces", auth.RoleReadOnly, s.handleNamespaces)
	s.routes.Read("GET /api/v1/resources/tasks", "resources_tasks", auth.RoleReadOnly, s.handleTasks)
	s.routes.Read("GET /api/v1/resources/queues", "resources_queues", auth.RoleReadOnly, s.handleResourceQueues)
	s.routes.Read("GET /api/v1/resources/queues/{queue}", "resources_queue", auth.RoleReadOnly, s.handleResourceQueue)
	s.routes.Read("GET /api/v1/resources/partitions", "resources_partitions", auth.RoleReadOnly, s.handlePartitions)
	s.routes.Read("GET /api/v1/messages", "messages", auth.RoleReadOnly, s.handleMessages)
	s.routes.Read("GET /api/v1/messages/{partitionId}/{transactionId}", "message", auth.RoleReadOnly, s.messageHandler(s.handleMessage))
	s.routes.Handle("DELETE /api/v1/messages/{partitionId}/{transactionId}", "message_delete", auth.RoleReadWrite, s.messageHandler(s.handleDeleteMessage))
	s.routes.Read("GET /api/v1/status", "status_dashboard", auth.RoleReadOnly, s.handleStatusDashboard)
	s.routes.Read("GET /api/v1/status/queues", "status_queues", auth.RoleReadOnly, s.handleStatusQueues)
	s.routes.Read("GET /api/v1/status/queues/{queue}", "status_queue", auth.RoleReadOnly, s.handleStatusQueue)
	s.routes.Read("GET /api/v1/status/queues/{queue}/messages", "status_queue_messages", auth.RoleReadOnly, s.handleStatusQueueMessages)
	s.routes.Read("GET /api/v1/status/analytics", "status_analytics", auth.RoleReadOnly, s.handleStatusAnalytics)
	s.routes.Read("GET /api/v1/status/buffers", "status_buffers", auth.RoleReadOnly, s.handleStatusBuffers)
}

// browseScope is the part of the queues a token's rights let it read, as
// the store's Scope: each consume pattern as a pair of regular expressions
// (a pattern without a partition reads every partition). Nil without a
// herald claim.
func browseScope(r *auth.Rights) *queue.Scope {
	if r == nil {
		return nil
	}
	sc := &queue.Scope{Queues: []string{}, Partitions: []string{}}
	for _, p := range r.Consume {
		q, part, two := strings.Cut(p, "/")
		if !two {
			part = "*"
		}
		sc.Queues = append(sc.Queues, "^"+auth.GlobRegexp(q)+"$")
		sc.Partitions = append(sc.Partitions, "^"+auth.GlobRegexp(part)+"$")
	}
	return sc
}

// checkQueueRead refuses a read naming a queue the token may read nothing of.
func checkQueueRead(r *auth.Rights, queue string) error {
	if queue != "" && !r.MaySeeQueue(queue) {
		return httpapi.Forbiddenf("this token may not read queue %s", queue)
	}
	return nil
}

// timeParam reads an optional RFC 3339 time; def when absent.
func timeParam(q url.Values, name string, def time.Time) (time.Time, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, httpapi.BadRequestf("%s must be an RFC 3339 time (2026-01-05T10:00:00.000Z)", name)
	}
	return t, nil
}

// timeRange reads from and to, defaulting to the span before now; from
// must come before to.
func timeRange(q url.Values, span time.Duration) (from, to time.Time, err error) {
	now := time.Now()
	if to, err = timeParam(q, "to", now); err != nil {
		return
	}
	if from, err = timeParam(q, "from", to.Add(-span)); err != nil {
		return
	}
	if !from.Before(to) {
		err = httpapi.BadRequestf("from must be before to")
	}
	return
}

// nameParam reads an optional queue or partition name.
func nameParam(q url.Values, param, kind string) (string, error) {
	v := q.Get(param)
	if v == "" {
		return "", nil
	}
	if err := queue.ValidateName(kind, v); err != nil {
		return "", err
	}
	return v, nil
}

type countsJSON struct {
	Total      int64 `json:"total"`
	Pending    int64 `json:"pending"`
	Processing int64 `json:"processing"`
	Completed  int64 `json:"completed"`
	Failed     int64 `json:"failed"`
	DeadLetter int64 `json:"deadLetter"`
}

func countsOf(c queue.Counts) countsJSON {
	return countsJSON{Total: c.Total, Pending: c.Pending, Processing: c.Processing, Completed: c.Completed,
		Failed: c.Failed, DeadLetter: c.DeadLetter}
}

func (c *countsJSON) add(o queue.Counts) {
	c.Total += o.Total
	c.Pending += o.Pending
	c.Processing += o.Processing
	c.Completed += o.Completed
	c.Failed += o.Failed
	c.DeadLetter += o.DeadLetter
}

type spreadJSON struct {
	Avg    float64 `json:"avg"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func spreadOf(s queue.Spread) spreadJSON {
	return spreadJSON{Avg: s.Avg, Median: s.Median, Min: s.Min, Max: s.Max}
}

type overviewJSON struct {
	Queues     int        `json:"queues"`
	Partitions int64      `json:"partitions"`
	Namespaces int        `json:"namespaces"`
	Tasks      int        `json:"tasks"`
	Messages   countsJSON `json:"messages"`
	Lag        struct {
		Time   spreadJSON `json:"time"`
		Offset spreadJSON `json:"offset"`
	} `json:"lag"`
	Throughput struct {
		IngestedPerSecond  float64 `json:"ingestedPerSecond"`
		ProcessedPerSecond float64 `json:"processedPerSecond"`
	} `json:"throughput"`
	Timestamp string `json:"timestamp"`
	StatsAge  int    `json:"statsAge"`
}

// handleOverview sums every queue in scope. Cost: browseQueues over all
// queues, the lag of the pairs with messages waiting, and the messages of
// the last minute.
func (s *service) handleOverview(w http.ResponseWriter, r *http.Request) error {
	f := queue.StatusFilter{Scope: browseScope(auth.RightsFrom(r.Context()))}
	list, err := s.Store.BrowseQueues(r.Context(), queue.QueuesQuery{Scope: f.Scope})
	if err != nil {
		return err
	}
	lag, err := s.Store.BrowseLag(r.Context(), f)
	if err != nil {
		return err
	}
	ingested, err := s.Store.BrowseIngested(r.Context(), f)
	if err != nil {
		return err
	}
	var out overviewJSON
	namespaces, tasks := map[string]bool{}, map[string]bool{}
	for _, q := range list.Queues {
		out.Partitions += q.Partitions
		out.Messages.add(q.Counts)
		if q.Namespace != "" {
			namespaces[q.Namespace] = true
		}
		if q.Task != "" {
			tasks[q.Task] = true
		}
	}
	out.Queues, out.Namespaces, out.Tasks = len(list.Queues), len(namespaces), len(tasks)
	out.Lag.Time, out.Lag.Offset = spreadOf(lag.Seconds), spreadOf(lag.Offset)
	out.Throughput.IngestedPerSecond = float64(ingested) / queue.IngestWindow.Seconds()
	out.Timestamp = httpapi.FormatMilli(time.Now())
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

type groupSummaryJSON struct {
	Namespace  *string `json:"namespace,omitempty"` // one of the two
	Task       *string `json:"task,omitempty"`
	Queues     int     `json:"queues"`
	Partitions int64   `json:"partitions"`
	Messages   struct {
		Total   int64 `json:"total"`
		Pending int64 `json:"pending"`
	} `json:"messages"`
}

func (s *service) handleNamespaces(w http.ResponseWriter, r *http.Request) error {
	return s.groupQueues(w, r, "namespaces", func(q queue.QueueSummary) string { return q.Namespace },
		func(g *groupSummaryJSON, name string) { g.Namespace = &name })
}

func (s *service) handleTasks(w http.ResponseWriter, r *http.Request) error {
	return s.groupQueues(w, r, "tasks", func(q queue.QueueSummary) string { return q.Task },
		func(g *groupSummaryJSON, name string) { g.Task = &name })
}

// groupQueues answers {list: [{namespace or task, queues, partitions,
// messages}]}: the queues in scope grouped by of (those without one are
// left out), sorted by name.
func (s *service) groupQueues(w http.ResponseWriter, r *http.Request, list string, of func(queue.QueueSummary) string,
	name func(*groupSummaryJSON, string)) error {
	all, err := s.Store.BrowseQueues(r.Context(), queue.QueuesQuery{Scope: browseScope(auth.RightsFrom(r.Context()))})
	if err != nil {
		return err
	}
	groups := map[string]*groupSummaryJSON{}
	var names []string
	for _, q := range all.Queues {
		key := of(q)
		if key == "" {
			continue
		}
		g := groups[key]
		if g == nil {
			g = &groupSummaryJSON{}
			name(g, key)
			groups[key] = g
			names = append(names, key)
		}
		g.Queues++
		g.Partitions += q.Partitions
		g.Messages.Total += q.Counts.Total
		g.Messages.Pending += q.Counts.Pending
	}
	sort.Strings(names)
	out := make([]*groupSummaryJSON, len(names))
	for i, n := range names {
		out[i] = groups[n]
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{list: out})
	return nil
}

type queueMessagesJSON struct {
	Total      int64 `json:"total"`
	Pending    int64 `json:"pending"`
	Processing int64 `json:"processing"`
}

// queueRefJSON names a queue: the first keys of every queue answer.
type queueRefJSON struct {
	ID        string  `json:"id"`
	Name      string  `json:"name"`
	Namespace *string `json:"namespace"`
	Task      *string `json:"task"`
}

func queueRef(q queue.QueueSummary) queueRefJSON {
	return queueRefJSON{ID: q.ID, Name: q.Name, Namespace: httpapi.Nullable(q.Namespace), Task: httpapi.Nullable(q.Task)}
}

type queueItemJSON struct {
	queueRefJSON
	CreatedAt  string            `json:"createdAt"`
	Partitions int64             `json:"partitions"`
	Messages   queueMessagesJSON `json:"messages"`
}

type paginationJSON struct {
	Limit  int   `json:"limit"`
	Offset int   `json:"offset"`
	Total  int64 `json:"total"`
}

// queueItem is a queue of a list; waiting makes pending count what is
// leased too (the reference server's /status/queues).
func queueItem(q queue.QueueSummary, waiting bool) queueItemJSON {
	m := queueMessagesJSON{Total: q.Counts.Total, Pending: q.Counts.Pending, Processing: q.Counts.Processing}
	if waiting {
		m.Pending = q.Counts.Waiting()
	}
	return queueItemJSON{queueRefJSON: queueRef(q), CreatedAt: httpapi.FormatMilli(q.CreatedAt), Partitions: q.Partitions, Messages: m}
}

// listQueues answers a page of queues newest first (the query's search,
// namespace and task narrow it).
func (s *service) listQueues(w http.ResponseWriter, r *http.Request, def int, waiting bool) error {
	q := r.URL.Query()
	limit, offset, err := httpapi.PageParams(q, def)
	if err != nil {
		return err
	}
	list, err := s.Store.BrowseQueues(r.Context(), queue.QueuesQuery{Search: q.Get("search"), Namespace: q.Get("namespace"),
		Task: q.Get("task"), Limit: limit, Offset: offset, Scope: browseScope(auth.RightsFrom(r.Context()))})
	if err != nil {
		return err
	}
	items := make([]queueItemJSON, len(list.Queues))
	for i, qs := range list.Queues {
		items[i] = queueItem(qs, waiting)
	}
	httpapi.WriteJSON(w, http.StatusOK, struct {
		Queues     []queueItemJSON `json:"queues"`
		Pagination paginationJSON  `json:"pagination"`
	}{items, paginationJSON{Limit: limit, Offset: offset, Total: list.Matching}})
	return nil
}

func (s *service) handleResourceQueues(w http.ResponseWriter, r *http.Request) error {
	return s.listQueues(w, r, queue.MaxBrowseLimit, false)
}

// partitionPage reads the queue named by the path (or ?queue=) and a page of
// its partitions, after the checks every such read makes.
func (s *service) partitionPage(r *http.Request, name string, def int, groups bool) (*queue.PartitionPage, int, int, error) {
	q := r.URL.Query()
	if name == "" {
		return nil, 0, 0, httpapi.BadRequestf("queue is required")
	}
	if err := queue.ValidateName("queue", name); err != nil {
		return nil, 0, 0, err
	}
	limit, offset, err := httpapi.PageParams(q, def)
	if err != nil {
		return nil, 0, 0, err
	}
	rights := auth.RightsFrom(r.Context())
	if err := checkQueueRead(rights, name); err != nil {
		return nil, 0, 0, err
	}
	page, err := s.Store.BrowsePartitions(r.Context(), queue.PartitionsQuery{Queue: name, Search: q.Get("search"),
		Prefix: q.Get("prefix"), After: q.Get("after"), Limit: limit, Offset: offset, Scope: browseScope(rights), Groups: groups})
	return page, limit, offset, err
}

type resourcePartitionJSON struct {
	ID            string     `json:"id"`
	Name          string     `json:"name"`
	CreatedAt     string     `json:"createdAt"`
	Stats         countsJSON `json:"stats"`
	OldestMessage *string    `json:"oldestMessage"`
	NewestMessage *string    `json:"newestMessage"`
}

type resourceQueueJSON struct {
	queueRefJSON
	CreatedAt  string                  `json:"createdAt"`
	Partitions []resourcePartitionJSON `json:"partitions"`
	Totals     countsJSON              `json:"totals"`
	Pagination paginationJSON          `json:"pagination"`
}

// handleResourceQueue answers one queue, its totals over every partition
// in scope and a page of its partitions by name (limit ≤ 1000, default
// 1000): a queue of 100,000 partitions is paged, not sent whole.
func (s *service) handleResourceQueue(w http.ResponseWriter, r *http.Request) error {
	page, limit, offset, err := s.partitionPage(r, r.PathValue("queue"), queue.MaxBrowseLimit, false)
	if err != nil {
		return err
	}
	qs := page.Queue
	out := resourceQueueJSON{queueRefJSON: queueRef(qs), CreatedAt: httpapi.FormatMilli(qs.CreatedAt), Partitions: make([]resourcePartitionJSON, len(page.Partitions)),
		Totals: countsOf(qs.Counts), Pagination: paginationJSON{Limit: limit, Offset: offset, Total: page.Matching}}
	for i, p := range page.Partitions {
		out.Partitions[i] = resourcePartitionJSON{ID: p.ID, Name: p.Name, CreatedAt: httpapi.FormatMilli(p.CreatedAt),
			Stats: countsOf(p.Counts), OldestMessage: httpapi.OptTime(p.Oldest), NewestMessage: httpapi.OptTime(p.Newest)}
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

type leaseJSON struct {
	ID        string  `json:"id"`
	Owner     string  `json:"owner"`
	Subject   *string `json:"subject"`
	From      int64   `json:"from"`
	To        int64   `json:"to"`
	ExpiresAt string  `json:"expiresAt"`
	Live      bool    `json:"live"`
}

type partitionGroupJSON struct {
	Name        string     `json:"name"`
	Cursor      int64      `json:"cursor"`
	Done        int64      `json:"done"`
	Lag         int64      `json:"lag"`
	Pending     int64      `json:"pending"`
	Processing  int64      `json:"processing"`
	DeliveredTo int64      `json:"deliveredTo"`
	Attempts    int        `json:"attempts"`
	LeasedAt    *string    `json:"leasedAt"`
	Lease       *leaseJSON `json:"lease"`
}

type partitionJSON struct {
	ID            string               `json:"id"`
	Name          string               `json:"name"`
	CreatedAt     string               `json:"createdAt"`
	LastOffset    int64                `json:"lastOffset"`
	LastPushAt    *string              `json:"lastPushAt"`
	LastActivity  *string              `json:"lastActivity"`
	OldestMessage *string              `json:"oldestMessage"`
	NewestMessage *string              `json:"newestMessage"`
	Messages      countsJSON           `json:"messages"`
	Groups        []partitionGroupJSON `json:"groups"`
}

type partitionsJSON struct {
	Queue      string          `json:"queue"`
	Partitions []partitionJSON `json:"partitions"`
	Pagination struct {
		Limit  int     `json:"limit"`
		Offset int     `json:"offset"`
		After  *string `json:"after"`
		Next   *string `json:"next"`
		Total  int64   `json:"total"`
	} `json:"pagination"`
}

// handlePartitions is Herald's (the reference server has no such route): a
// queue's partitions by name, paged with limit/offset or keyset (after:
// the last name of the previous page, as next gives it), searchable, with
// each consumer group's cursor, lag and lease.
func (s *service) handlePartitions(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	page, limit, offset, err := s.partitionPage(r, q.Get("queue"), 100, true)
	if err != nil {
		return err
	}
	parts := make([]partitionJSON, len(page.Partitions))
	for i, p := range page.Partitions {
		pj := partitionJSON{ID: p.ID, Name: p.Name, CreatedAt: httpapi.FormatMilli(p.CreatedAt), LastOffset: p.LastOffset,
			LastPushAt: httpapi.OptTime(p.LastPushAt), LastActivity: httpapi.OptTime(p.LastActivity), OldestMessage: httpapi.OptTime(p.Oldest),
			NewestMessage: httpapi.OptTime(p.Newest), Messages: countsOf(p.Counts), Groups: make([]partitionGroupJSON, len(p.Groups))}
		for j, g := range p.Groups {
			gj := partitionGroupJSON{Name: g.Group, Cursor: g.Cursor, Done: g.Done, Lag: g.Lag, Pending: g.Lag - g.Processing,
				Processing: g.Processing, DeliveredTo: g.DeliveredTo, Attempts: g.Attempts, LeasedAt: httpapi.OptTime(g.LeasedAt)}
			if l := g.Lease; l != nil {
				gj.Lease = &leaseJSON{ID: l.ID, Owner: l.Owner, Subject: httpapi.Nullable(l.Subject), From: l.From, To: l.To,
					ExpiresAt: httpapi.FormatMilli(l.ExpiresAt), Live: l.Live}
			}
			pj.Groups[j] = gj
		}
		parts[i] = pj
	}
	var next *string
	if n := len(page.Partitions); n == limit {
		next = &page.Partitions[n-1].Name
	}
	var out partitionsJSON
	out.Queue, out.Partitions = page.Queue.Name, parts
	out.Pagination.Limit, out.Pagination.Offset, out.Pagination.After = limit, offset, httpapi.Nullable(q.Get("after"))
	out.Pagination.Next, out.Pagination.Total = next, page.Matching
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
