package admin

import (
	"cmp"
	"net/http"
	"slices"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

// GET /api/v1/status/backlog: what each consumer group has not finished,
// how old the oldest of it is, and its dead letters, for the console's
// overview. The figures are the hygiene loop's latest sample
// (queue.Store.LatestBacklog), so a request costs no query and a console
// refreshing every few seconds adds no load: they are up to one hygiene
// interval (30 s) old, and cover the queue.BacklogTop pairs with the
// most waiting and the queue.BacklogTop largest dead-letter queues.

// backlogGroupJSON is one (queue, group) pair of the backlog.
type backlogGroupJSON struct {
	Queue         string `json:"queue"`
	Group         string `json:"group"`
	Lag           int64  `json:"lag"`
	LagPartitions int64  `json:"lagPartitions"`
	// OldestPendingAgeSeconds is as of sampledAt; null when nothing
	// waits (or retention removed what did).
	OldestPendingAgeSeconds *float64 `json:"oldestPendingAgeSeconds"`
	DeadLetters             int64    `json:"deadLetters"`
}

// backlogJSON is the answer of GET /api/v1/status/backlog.
type backlogJSON struct {
	SampledAt string             `json:"sampledAt"`
	Top       int                `json:"top"`
	Groups    []backlogGroupJSON `json:"groups"`
}

// handleBacklog answers GET /api/v1/status/backlog (admin).
func (s *service) handleBacklog(w http.ResponseWriter, r *http.Request) error {
	b, err := s.Store.LatestBacklog(r.Context())
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, backlogJSON{SampledAt: httpapi.FormatMilli(b.At), Top: queue.BacklogTop,
		Groups: backlogGroups(b, auth.RightsFrom(r.Context()))})
	return nil
}

// backlogGroups joins a sample's lag and dead-letter counts by (queue,
// group), keeping the pairs rights may read; the most waiting first, then
// the most dead letters.
func backlogGroups(b *queue.BacklogSample, rights *auth.Rights) []backlogGroupJSON {
	type pair struct{ queue, group string }
	at := map[pair]int{}
	out := []backlogGroupJSON{}
	row := func(q, g string) *backlogGroupJSON {
		k := pair{q, g}
		i, ok := at[k]
		if !ok {
			i = len(out)
			at[k] = i
			out = append(out, backlogGroupJSON{Queue: q, Group: g})
		}
		return &out[i]
	}
	for _, l := range b.Backlog {
		if !rights.MayConsume(l.Queue, "") {
			continue
		}
		j := row(l.Queue, l.Group)
		j.Lag, j.LagPartitions = l.Waiting, l.Partitions
		if l.Waiting > 0 && l.OldestAge > 0 {
			secs := l.OldestAge.Seconds()
			j.OldestPendingAgeSeconds = &secs
		}
	}
	for _, d := range b.DeadLetters {
		if rights.MayConsume(d.Queue, "") {
			row(d.Queue, d.Group).DeadLetters = d.N
		}
	}
	slices.SortStableFunc(out, func(a, b backlogGroupJSON) int {
		return cmp.Or(cmp.Compare(b.Lag, a.Lag), cmp.Compare(b.DeadLetters, a.DeadLetters),
			cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Group, b.Group))
	})
	return out
}
