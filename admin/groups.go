package admin

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

// consumerGroupRoutes registers the routes of consumer groups: list,
// lagging, details, delete, subscription, seek. Roles as the reference
// server's: reads read-only, seek and subscription read-write, deletes
// admin. "lagging" is matched before {group}, as on the reference.
func (s *service) consumerGroupRoutes() {
	s.routes.Read("GET /api/v1/consumer-groups", "groups", auth.RoleReadOnly, s.handleGroups)
	s.routes.Read("GET /api/v1/consumer-groups/lagging", "groups_lagging", auth.RoleReadOnly, s.handleGroupsLagging)
	s.routes.Read("GET /api/v1/consumer-groups/{group}", "group", auth.RoleReadOnly, s.handleGroup)
	s.routes.Handle("DELETE /api/v1/consumer-groups/{group}", "group_delete", auth.RoleAdmin, s.handleGroupDelete)
	s.routes.Handle("DELETE /api/v1/consumer-groups/{group}/queues/{queue}", "group_delete_queue", auth.RoleAdmin, s.handleGroupDelete)
	s.routes.Handle("POST /api/v1/consumer-groups/{group}/subscription", "group_subscription", auth.RoleReadWrite, s.handleGroupSubscription)
	s.routes.Handle("POST /api/v1/consumer-groups/{group}/queues/{queue}/seek", "group_seek", auth.RoleReadWrite, s.handleGroupSeek)
	s.routes.Handle("POST /api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition}/seek", "group_seek_partition",
		auth.RoleReadWrite, s.handleGroupSeek)
}

// groupState is the reference server's word for a group on a queue.
func groupState(g queue.GroupSummary) string {
	switch {
	case g.MaxTimeLag > 300*time.Second:
		return "Lagging"
	case g.Consumed:
		return "Stable"
	}
	return "Dead"
}

func (s *service) handleGroups(w http.ResponseWriter, r *http.Request) error {
	groups, err := s.Store.ConsumerGroups(r.Context())
	if err != nil {
		return err
	}
	rights := auth.RightsFrom(r.Context())
	out := make([]map[string]any, 0, len(groups))
	for _, g := range groups {
		if !rights.MayConsume(g.Queue, "") {
			continue // a token that may not read a whole queue does not see who reads it
		}
		var mode any
		if g.SubscriptionMode != "" {
			mode = g.SubscriptionMode
		}
		out = append(out, map[string]any{
			"name": g.Group, "topics": []string{g.Queue}, "queueName": g.Queue, "members": g.Members,
			"partitionsWithLag": g.Lagging, "totalLag": nil, "maxTimeLag": int64(g.MaxTimeLag.Seconds()),
			"state": groupState(g), "subscriptionMode": mode, "subscriptionTimestamp": httpapi.OptTime(g.SubscribedFrom),
			"subscriptionCreatedAt": httpapi.OptTime(g.SubscribedAt), "lastSeenAt": httpapi.OptTime(g.LastSeenAt),
			"idleGroupRetentionSeconds": g.IdleRetention,
		})
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *service) handleGroupsLagging(w http.ResponseWriter, r *http.Request) error {
	minLag := 3600
	if v := r.URL.Query().Get("minLagSeconds"); v != "" {
		var err error
		if minLag, err = httpapi.IntParam(v, "minLagSeconds", 0, queue.MaxKeepSeconds); err != nil {
			return err
		}
	}
	limit, offset, err := httpapi.PageParams(r.URL.Query(), 100)
	if err != nil {
		return err
	}
	lags, err := s.Store.Lagging(r.Context(), time.Duration(minLag)*time.Second, limit, offset)
	if err != nil {
		return err
	}
	rights := auth.RightsFrom(r.Context())
	now := time.Now()
	out := make([]map[string]any, 0, len(lags))
	for _, l := range lags {
		if !rights.MayConsume(l.Queue, l.Partition) {
			continue
		}
		var owner any
		if l.LeaseOwner != "" {
			owner = l.LeaseOwner
		}
		lag := time.Duration(0)
		if l.OldestUnconsumed != nil {
			lag = now.Sub(*l.OldestUnconsumed)
		}
		out = append(out, map[string]any{
			"consumer_group": l.Group, "queue_name": l.Queue, "partition_name": l.Partition, "partition_id": l.PartitionID,
			"worker_id": owner, "offset_lag": l.OffsetLag, "time_lag_seconds": int64(lag.Seconds()),
			"lag_hours": math.Round(lag.Hours()*100) / 100, "oldest_unconsumed_at": httpapi.OptTime(l.OldestUnconsumed),
			"last_consumed_at": httpapi.OptTime(l.LastConsumed),
		})
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *service) handleGroup(w http.ResponseWriter, r *http.Request) error {
	group := r.PathValue("group")
	parts, truncated, err := s.Store.GroupPartitions(r.Context(), group, r.URL.Query().Get("queue"))
	if err != nil {
		return err
	}
	if len(parts) == 0 {
		return httpapi.Status(http.StatusNotFound, "Consumer group not found")
	}
	rights := auth.RightsFrom(r.Context())
	now := time.Now()
	out := map[string]any{}
	for _, p := range parts {
		if !rights.MayConsume(p.Queue, p.Partition) {
			continue
		}
		q, _ := out[p.Queue].(map[string]any)
		if q == nil {
			q = map[string]any{"partitions": []map[string]any{}}
			out[p.Queue] = q
		}
		var owner any
		if p.LeaseOwner != "" {
			owner = p.LeaseOwner
		}
		lag := int64(0)
		if p.OldestUnconsumed != nil {
			lag = int64(now.Sub(*p.OldestUnconsumed).Seconds())
		}
		q["partitions"] = append(q["partitions"].([]map[string]any), map[string]any{
			"partition": p.Partition, "workerId": owner, "lastConsumedAt": httpapi.OptTime(p.LastConsumed),
			"totalConsumed": p.Consumed, "offsetLag": p.OffsetLag, "timeLagSeconds": lag,
			"leaseActive": p.LeaseExpires != nil, "leaseExpiresAt": httpapi.OptTime(p.LeaseExpires),
		})
	}
	if len(out) == 0 {
		// Only on partitions beyond the token's rights: as if it did not
		// exist (a 403 would confirm another tenant's group).
		return httpapi.Status(http.StatusNotFound, "Consumer group not found")
	}
	if truncated {
		w.Header().Set("X-Herald-Truncated", "true") // more than queue.MaxGroupPartitions partitions
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// groupWide refuses a token with rights an act on every queue of a group:
// its rights cannot be checked queue by queue before the act.
func groupWide(r *http.Request, what string) error {
	if auth.RightsFrom(r.Context()) != nil {
		return httpapi.Forbiddenf("a token with rights may not %s on every queue at once: name the queue", what)
	}
	return nil
}

func (s *service) handleGroupDelete(w http.ResponseWriter, r *http.Request) error {
	group, queueName := r.PathValue("group"), r.PathValue("queue")
	deleteMetadata := true
	if v := r.URL.Query().Get("deleteMetadata"); v != "" {
		var err error
		if deleteMetadata, err = httpapi.BoolParam(v, "deleteMetadata"); err != nil {
			return err
		}
	}
	var err error
	if queueName == "" {
		err = groupWide(r, "delete a consumer group")
	} else if !auth.RightsFrom(r.Context()).MayConsume(queueName, "") {
		err = httpapi.Forbiddenf("this token may not consume the whole queue %s", queueName)
	}
	if err != nil {
		return err
	}
	res, err := s.Store.DeleteGroup(r.Context(), group, queueName, deleteMetadata)
	if err != nil {
		return err
	}
	s.Effects.AfterGroupMoved(res.Released)
	out := map[string]any{"success": true, "consumerGroup": group, "deletedPartitions": res.Partitions,
		"metadataDeleted": res.MetadataDeleted}
	if queueName != "" {
		out["queueName"] = queueName
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *service) handleGroupSubscription(w http.ResponseWriter, r *http.Request) error {
	group := r.PathValue("group")
	obj, err := httpapi.ReadObject(r)
	if err != nil {
		return err
	}
	raw, ok := obj["subscriptionTimestamp"]
	if !ok {
		return httpapi.BadRequest("Missing subscriptionTimestamp in request body")
	}
	var ts string
	if err := json.Unmarshal(raw, &ts); err != nil {
		return httpapi.BadRequest("subscriptionTimestamp must be an RFC 3339 time string")
	}
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return httpapi.BadRequest("subscriptionTimestamp must be an RFC 3339 time string")
	}
	if err := groupWide(r, "move a consumer group's subscription"); err != nil {
		return err
	}
	n, err := s.Store.SetSubscription(r.Context(), group, at)
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"success": true, "consumerGroup": group, "newTimestamp": ts, "rowsUpdated": n})
	return nil
}

func (s *service) handleGroupSeek(w http.ResponseWriter, r *http.Request) error {
	group, queueName, partition := r.PathValue("group"), r.PathValue("queue"), r.PathValue("partition")
	var to *time.Time
	var toEnd bool
	if partition == "" {
		// The one-partition seek reads no body: it always goes to the end.
		obj, err := httpapi.ReadObject(r)
		if err != nil {
			return err
		}
		if raw, ok := obj["toEnd"]; ok && !httpapi.IsNull(raw) {
			if err := json.Unmarshal(raw, &toEnd); err != nil {
				return httpapi.BadRequest("toEnd must be true or false")
			}
		}
		var ts string
		if raw, ok := obj["timestamp"]; ok && !httpapi.IsNull(raw) {
			if err := json.Unmarshal(raw, &ts); err != nil {
				return httpapi.BadRequest("timestamp must be an RFC 3339 time string")
			}
		}
		switch {
		case toEnd:
		case ts != "":
			at, err := time.Parse(time.RFC3339Nano, ts)
			if err != nil {
				return httpapi.BadRequest("timestamp must be an RFC 3339 time string")
			}
			to = &at
		default:
			return httpapi.BadRequest("Must specify either 'toEnd': true or 'timestamp'")
		}
	}
	if !auth.RightsFrom(r.Context()).MayConsume(queueName, partition) {
		return httpapi.Forbiddenf("this token may not consume %s", joinQP(queueName, partition))
	}
	res, err := s.Store.Seek(r.Context(), group, queueName, partition, to)
	if errors.Is(err, queue.ErrNotFound) {
		return httpapi.Status(http.StatusNotFound, "Partition not found")
	}
	if err != nil {
		return err
	}
	s.Effects.AfterGroupMoved(res.Released)
	if res.Partitions > 0 {
		// Messages after the new position are to be read again.
		s.Effects.WakeQueue(queueName)
	}
	if partition != "" {
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"success": true, "consumerGroup": group, "queueName": queueName,
			"partitionName": partition, "updated": res.Partitions > 0, "cursorMovedTo": httpapi.OptTime(res.MovedTo)})
		return nil
	}
	var target any
	if to != nil {
		target = httpapi.FormatMilli(*to)
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"success": true, "consumerGroup": group, "queueName": queueName,
		"seekToEnd": toEnd, "targetTimestamp": target, "partitionsUpdated": res.Partitions})
	return nil
}

// joinQP names a queue, or one of its partitions.
func joinQP(q, p string) string {
	if p == "" {
		return "the whole queue " + q
	}
	return q + "/" + p
}
