package admin

import (
	"net/http"
	"strings"
	"time"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

type busStatusJSON struct {
	ConsumedBy  int `json:"consumedBy"`
	TotalGroups int `json:"totalGroups"`
}

// messageRefJSON names a message: the first keys of every message answer.
type messageRefJSON struct {
	ID            string `json:"id"`
	TransactionID string `json:"transactionId"`
	PartitionID   string `json:"partitionId"`
	QueuePath     string `json:"queuePath"`
	Queue         string `json:"queue"`
	Partition     string `json:"partition"`
}

func messageRef(m queue.MessageInfo) messageRefJSON {
	return messageRefJSON{ID: m.ID, TransactionID: m.TransactionID, PartitionID: m.PartitionID,
		QueuePath: m.Queue + "/" + m.Partition, Queue: m.Queue, Partition: m.Partition}
}

type messageItemJSON struct {
	messageRefJSON
	Namespace      *string       `json:"namespace"`
	Task           *string       `json:"task"`
	Status         string        `json:"status"`
	QueueStatus    *string       `json:"queueStatus"`
	BusStatus      busStatusJSON `json:"busStatus"`
	TraceID        *string       `json:"traceId"`
	ProducerSub    *string       `json:"producerSub"`
	QueuePriority  int           `json:"queuePriority"`
	CreatedAt      string        `json:"createdAt"`
	LeaseExpiresAt *string       `json:"leaseExpiresAt"`
}

type modeJSON struct {
	HasQueueMode   bool   `json:"hasQueueMode"`
	BusGroupsCount int    `json:"busGroupsCount"`
	Type           string `json:"type"`
}

func messageItem(m queue.MessageInfo) messageItemJSON {
	return messageItemJSON{messageRefJSON: messageRef(m), Namespace: httpapi.Nullable(m.Namespace),
		Task: httpapi.Nullable(m.Task), Status: m.State, QueueStatus: httpapi.Nullable(m.QueueState),
		BusStatus: busStatusJSON{ConsumedBy: m.ConsumedBy, TotalGroups: m.BusGroups}, TraceID: httpapi.Nullable(m.TraceID),
		ProducerSub: httpapi.Nullable(m.ProducerSub), QueuePriority: m.Priority, CreatedAt: httpapi.FormatMilli(m.CreatedAt),
		LeaseExpiresAt: httpapi.OptTime(m.LeaseExpiresAt)}
}

// messageQuery reads the filters of a message listing: queue, partition,
// ns, task, status, from and to (the window before now by default, none
// when window is 0; to is exclusive), limit and offset. A token's rights
// narrow it; naming a queue or partition outside them is 403.
func messageQuery(r *http.Request, defLimit int, window time.Duration) (queue.MessageQuery, error) {
	q := r.URL.Query()
	var qry queue.MessageQuery
	var err error
	if qry.Queue, err = nameParam(q, "queue", "queue"); err != nil {
		return qry, err
	}
	if qry.Partition, err = nameParam(q, "partition", "partition"); err != nil {
		return qry, err
	}
	qry.Namespace, qry.Task = q.Get("ns"), q.Get("task")
	if qry.State = q.Get("status"); qry.State != "" && !queue.ValidState(qry.State) {
		return qry, httpapi.BadRequestf("status must be pending, processing, completed or dead_letter")
	}
	if qry.Limit, qry.Offset, err = httpapi.PageParams(q, defLimit); err != nil {
		return qry, err
	}
	switch {
	case window > 0:
		if qry.From, qry.To, err = timeRange(q, window); err != nil {
			return qry, err
		}
		if q.Get("to") == "" {
			qry.To = time.Time{} // open: what arrives while the answer is read counts too
		}
	default: // no window unless asked for
		if qry.From, err = timeParam(q, "from", time.Time{}); err != nil {
			return qry, err
		}
		if qry.To, err = timeParam(q, "to", time.Time{}); err != nil {
			return qry, err
		}
		if !qry.From.IsZero() && !qry.To.IsZero() && !qry.From.Before(qry.To) {
			return qry, httpapi.BadRequestf("from must be before to")
		}
	}
	rights := auth.RightsFrom(r.Context())
	if err := checkQueueRead(rights, qry.Queue); err != nil {
		return qry, err
	}
	if qry.Queue != "" && qry.Partition != "" && !rights.MayConsume(qry.Queue, qry.Partition) {
		return qry, httpapi.Forbiddenf("this token may not read %s/%s", qry.Queue, qry.Partition)
	}
	qry.Scope = browseScope(rights)
	return qry, nil
}

type messagesJSON struct {
	Messages   []messageItemJSON `json:"messages"`
	Mode       modeJSON          `json:"mode"`
	Pagination struct {
		Limit  int `json:"limit"`
		Offset int `json:"offset"`
	} `json:"pagination"`
}

// handleMessages lists messages newest first, without payloads.
func (s *service) handleMessages(w http.ResponseWriter, r *http.Request) error {
	qry, err := messageQuery(r, 200, time.Hour)
	if err != nil {
		return err
	}
	list, err := s.Store.BrowseMessages(r.Context(), qry)
	if err != nil {
		return err
	}
	items := make([]messageItemJSON, len(list.Messages))
	for i, m := range list.Messages {
		items[i] = messageItem(m)
	}
	var out messagesJSON
	out.Messages = items
	out.Mode = modeJSON{HasQueueMode: list.Mode.QueueMode, BusGroupsCount: list.Mode.BusGroups, Type: list.Mode.Type()}
	out.Pagination.Limit, out.Pagination.Offset = qry.Limit, qry.Offset
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// messageHandler adapts a handler of a route that names one message
// (/{partitionId}/{transactionId}): it runs with the message's ids once
// checkMessage has let them through.
func (s *service) messageHandler(h func(w http.ResponseWriter, r *http.Request, partitionID, transactionID string) error) httpapi.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		pid, txid, err := s.checkMessage(r)
		if err != nil {
			return err
		}
		return h(w, r, pid, txid)
	}
}

// checkMessage refuses a path whose partition id is not a UUID (400); a
// partition that does not exist, or that the token may not consume, is
// ErrMessageNotFound, after the same lookup (see gateway/authorize.go). The partition
// id is read in any case and returned in lower case.
func (s *service) checkMessage(r *http.Request) (partitionID, transactionID string, err error) {
	partitionID, transactionID = r.PathValue("partitionId"), r.PathValue("transactionId")
	if !queue.ValidUUID(partitionID) {
		return "", "", httpapi.BadRequestf("partitionId must be a UUID")
	}
	partitionID = strings.ToLower(partitionID)
	names, err := s.Visible(r.Context(), auth.RightsFrom(r.Context()), []string{partitionID})
	if err != nil {
		return "", "", err
	}
	if _, ok := names[partitionID]; !ok {
		return "", "", queue.ErrMessageNotFound
	}
	return partitionID, transactionID, nil
}

type messageGroupJSON struct {
	Name           string  `json:"name"`
	Consumed       bool    `json:"consumed"`
	Status         string  `json:"status"`
	LeaseExpiresAt *string `json:"leaseExpiresAt"`
}

type messageDetailJSON struct {
	messageRefJSON
	Namespace      *string            `json:"namespace"`
	Task           *string            `json:"task"`
	Status         string             `json:"status"`
	Payload        httpapi.Raw        `json:"payload"`
	IsEncrypted    bool               `json:"isEncrypted"`
	TraceID        *string            `json:"traceId"`
	ProducerSub    *string            `json:"producerSub"`
	CreatedAt      string             `json:"createdAt"`
	ErrorMessage   *string            `json:"errorMessage"`
	RetryCount     *int               `json:"retryCount"`
	LeaseExpiresAt *string            `json:"leaseExpiresAt"`
	QueueConfig    queueConfigJSON    `json:"queueConfig"`
	Mode           messageModeJSON    `json:"mode"`
	ConsumerGroups []messageGroupJSON `json:"consumerGroups"`
}

type queueConfigJSON struct {
	LeaseTime  int `json:"leaseTime"`
	RetryLimit int `json:"retryLimit"`
	RetryDelay int `json:"retryDelay"`
	TTL        int `json:"ttl"`
	Priority   int `json:"priority"`
}

type messageModeJSON struct {
	HasQueueMode     bool   `json:"hasQueueMode"`
	BusGroupsCount   int    `json:"busGroupsCount"`
	ConsumedByGroups int    `json:"consumedByGroups"`
	Type             string `json:"type"`
}

// handleMessage answers one message with its payload (decrypted as a pop
// decrypts it; null when it fails to), or, when the message is gone but
// was dead-lettered, its dead-lettered copy.
func (s *service) handleMessage(w http.ResponseWriter, r *http.Request, pid, txid string) error {
	d, err := s.Store.BrowseMessage(r.Context(), pid, txid)
	if err != nil {
		return err
	}
	m := d.MessageInfo
	mode := queue.Mode{QueueMode: m.QueueState != "", BusGroups: m.BusGroups}
	out := messageDetailJSON{messageRefJSON: messageRef(m), Namespace: httpapi.Nullable(m.Namespace),
		Task: httpapi.Nullable(m.Task), Status: m.State, Payload: httpapi.Raw(d.Data), IsEncrypted: d.Encrypted,
		TraceID: httpapi.Nullable(m.TraceID), ProducerSub: httpapi.Nullable(m.ProducerSub), CreatedAt: httpapi.FormatMilli(m.CreatedAt),
		ErrorMessage: d.ErrorMessage, RetryCount: d.RetryCount, LeaseExpiresAt: httpapi.OptTime(m.LeaseExpiresAt),
		QueueConfig: queueConfigJSON{LeaseTime: d.Options.LeaseTime, RetryLimit: d.Options.RetryLimit,
			RetryDelay: d.Options.RetryDelay, TTL: d.Options.TTL, Priority: d.Options.Priority},
		Mode: messageModeJSON{HasQueueMode: mode.QueueMode, BusGroupsCount: mode.BusGroups, ConsumedByGroups: m.ConsumedBy,
			Type: mode.Type()},
		ConsumerGroups: make([]messageGroupJSON, len(d.Groups))}
	for i, g := range d.Groups {
		out.ConsumerGroups[i] = messageGroupJSON{Name: g.Group, Consumed: g.State == queue.StateCompleted ||
			g.State == queue.StateDeadLetter, Status: g.State, LeaseExpiresAt: httpapi.OptTime(g.LeaseExpiresAt)}
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

type deletedJSON struct {
	Success       bool   `json:"success"`
	PartitionID   string `json:"partitionId"`
	TransactionID string `json:"transactionId"`
	Message       string `json:"message"`
}

// handleDeleteMessage deletes one message and its dead letters. Every
// consumer group counts it as finished (queue.DeleteMessage): cursors move
// over it, a live lease it ends is released (and its waiters woken), and
// a stream of this instance holding it gets its credit back.
func (s *service) handleDeleteMessage(w http.ResponseWriter, r *http.Request, pid, txid string) error {
	res, err := s.Store.DeleteMessage(r.Context(), pid, txid)
	if err != nil {
		return err
	}
	s.Effects.AfterMessageDeleted(res, pid, txid)
	httpapi.WriteJSON(w, http.StatusOK, deletedJSON{Success: true, PartitionID: pid, TransactionID: txid,
		Message: "Message deleted successfully"})
	return nil
}
