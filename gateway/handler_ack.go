package gateway

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

type ackJSON struct {
	DLQ           bool    `json:"dlq"`
	Error         *string `json:"error"`
	Index         int     `json:"index"`
	LeaseReleased bool    `json:"leaseReleased"`
	PartitionName *string `json:"partitionName"`
	QueueName     *string `json:"queueName"`
	Success       bool    `json:"success"`
	TransactionID string  `json:"transactionId"`
}

func ackResultJSON(r queue.AckResult) ackJSON {
	return ackJSON{DLQ: r.DLQ, Error: httpapi.Nullable(r.Error), Index: r.Index, LeaseReleased: r.LeaseReleased,
		PartitionName: httpapi.Nullable(r.Partition), QueueName: httpapi.Nullable(r.Queue), Success: r.Success, TransactionID: r.TransactionID}
}

// parseAck reads one acknowledgement object. single selects the error texts
// of POST /ack (the batch route words them differently).
func parseAck(obj map[string]json.RawMessage, single bool) (queue.Ack, error) {
	return parseAckItem(&ackItemJSON{TransactionID: obj["transactionId"], PartitionID: obj["partitionId"],
		LeaseID: obj["leaseId"], ConsumerGroup: obj["consumerGroup"], Status: obj["status"], Error: obj["error"]}, single)
}

// parseAckItem is parseAck over a decoded item.
func parseAckItem(it *ackItemJSON, single bool) (queue.Ack, error) {
	var a queue.Ack
	txid, ok, err := httpapi.StringValue(it.TransactionID, "transactionId")
	if err != nil || !ok || txid == "" {
		if single {
			return a, httpapi.BadRequestf("transactionId is required")
		}
		return a, httpapi.BadRequestf("Each acknowledgment must have a transactionId string")
	}
	pid, ok, err := httpapi.StringValue(it.PartitionID, "partitionId")
	if err != nil || !ok || pid == "" {
		if single {
			return a, httpapi.BadRequestf("partitionId is required to ensure message uniqueness")
		}
		return a, httpapi.BadRequestf("Each acknowledgment must have a valid partitionId string to ensure message uniqueness")
	}
	a.TransactionID, a.PartitionID = txid, anyCase(pid)
	if a.LeaseID, _, err = httpapi.StringValue(it.LeaseID, "leaseId"); err != nil {
		return a, httpapi.BadRequestf("%v", err)
	}
	a.LeaseID = anyCase(a.LeaseID)
	if a.Group, _, err = httpapi.StringValue(it.ConsumerGroup, "consumerGroup"); err != nil {
		return a, httpapi.BadRequestf("%v", err)
	}
	if a.Error, _, err = httpapi.StringValue(it.Error, "error"); err != nil {
		return a, httpapi.BadRequestf("%v", err)
	}
	status, _, err := httpapi.StringValue(it.Status, "status")
	if err != nil {
		return a, httpapi.BadRequestf("%v", err)
	}
	if a.Status, err = queue.ParseAckStatus(status); err != nil {
		return a, err
	}
	return a, nil
}

func (s *Server) handleAck(w http.ResponseWriter, r *http.Request) error {
	obj, err := httpapi.ReadObject(r)
	if err != nil {
		return err
	}
	a, err := parseAck(obj, true)
	if err != nil {
		return err
	}
	return s.ack(w, r, []queue.Ack{a})
}

func (s *Server) handleAckBatch(w http.ResponseWriter, r *http.Request) error {
	obj, err := httpapi.ReadObject(r)
	if err != nil {
		return err
	}
	arr, ok := httpapi.ArrayField(obj, "acknowledgments")
	if !ok {
		return httpapi.BadRequest("acknowledgments array is required")
	}
	group, _, err := httpapi.StringField(obj, "consumerGroup")
	if err != nil {
		return httpapi.BadRequestf("%v", err)
	}
	acks := make([]queue.Ack, len(arr))
	for i, raw := range arr {
		var item ackItemJSON
		if !item.decode(raw) {
			return httpapi.BadRequest("Each acknowledgment must be an object")
		}
		if acks[i], err = parseAckItem(&item, false); err != nil {
			return err
		}
		if group != "" {
			acks[i].Group = group
		}
	}
	return s.ack(w, r, acks)
}

func (s *Server) ack(w http.ResponseWriter, r *http.Request, acks []queue.Ack) error {
	if err := s.hideAcks(r.Context(), rightsOf(r.Context()), acks); err != nil {
		return err
	}
	holder := holderOf(r.Context())
	for i := range acks {
		acks[i].Holder = holder
	}
	results, err := s.store.Ack(r.Context(), acks)
	if err != nil {
		if queue.OutcomeUnknown(err) {
			s.poller.AckLost(acks) // it may have committed: wake what it freed
		}
		return err
	}
	s.afterAck(acks, results)
	out := make([]ackJSON, len(results))
	foreign := 0
	for i, res := range results {
		out[i] = ackResultJSON(res)
		if res.Error == queue.ErrTextForeign {
			foreign++
		}
	}
	status := http.StatusOK
	if foreign > 0 && foreign == len(results) {
		// Every item named another subject's delivery: nothing was done.
		status = http.StatusForbidden
	}
	httpapi.WriteJSON(w, status, out)
	return nil
}

// ackItemJSON holds the fields of an ack item, undecoded: a struct, not a
// map per item (batches under load carry a hundred items).
type ackItemJSON struct {
	TransactionID, PartitionID, LeaseID, ConsumerGroup, Status, Error, Sub json.RawMessage
}

// ackItemNames are the members of an ack item that ackItemJSON holds.
var ackItemNames = []string{"transactionId", "partitionId", "leaseId", "consumerGroup", "status", "error", "sub"}

// decode reads an ack item's fields from raw, a JSON object, matching
// names exactly (see eachMember); false when raw is not an object.
func (it *ackItemJSON) decode(raw json.RawMessage) bool {
	return membersInto(raw, ackItemNames, &it.TransactionID, &it.PartitionID, &it.LeaseID, &it.ConsumerGroup,
		&it.Status, &it.Error, &it.Sub)
}

// anyCase spells a UUID as PostgreSQL does (lower case), so that an id
// read in any case, as docs/api.md says, names the same partition or lease
// wherever ids are compared as text (a lease's id, a connection's
// deliveries); anything else is returned as it is.
func anyCase(id string) string {
	if queue.ValidUUID(id) {
		return strings.ToLower(id)
	}
	return id
}
