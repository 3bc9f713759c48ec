package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/httpapi"
	"github.com/heraldmq/herald/queue"
)

// The gateway's side of auth: a request's token checked at the door of
// each route (authorize), the claims it leaves in the request's context
// (rightsOf, subjectOf, holderOf), and the checks of rights that need the
// store or its types. What a token is, says and may do is the auth
// package's.

// authorize checks the request's token against need, and a token from the
// cookie alone against what the route does (eff). On failure it answers
// 401 (no or bad token) or 403 (role too low, the cookie refused) and
// returns false; with auth off it lets everything through.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, need auth.Role, eff auth.Effect) (*http.Request, bool) {
	if s.cfg.Auth == nil || need == auth.RoleNone {
		return r, true
	}
	c, err := s.checkToken(r, need, eff)
	if err != nil {
		status := http.StatusUnauthorized
		if errors.Is(err, auth.ErrForbidden) {
			status = http.StatusForbidden
		} else {
			w.Header().Set("WWW-Authenticate", `Bearer realm="herald"`)
		}
		httpapi.WriteError(w, status, err.Error())
		return r, false
	}
	return r.WithContext(auth.WithClaims(r.Context(), c)), true
}

func (s *Server) checkToken(r *http.Request, need auth.Role, eff auth.Effect) (auth.Claims, error) {
	tok, from := auth.Bearer(r, s.cfg.Auth.Cookie)
	if tok == "" {
		s.metrics.authFailures.WithLabelValues("missing").Inc()
		return auth.Claims{}, auth.ErrNoToken
	}
	if from == auth.FromCookie {
		if err := auth.CookieRule(r, eff, s.allowedOrigins); err != nil {
			s.metrics.authFailures.WithLabelValues("cross_site").Inc()
			return auth.Claims{}, err
		}
	}
	c, err := s.cfg.Auth.Verify(tok, time.Now())
	if err != nil {
		s.metrics.authFailures.WithLabelValues("invalid").Inc()
		return auth.Claims{}, err
	}
	if c.Role < need {
		s.metrics.authFailures.WithLabelValues("forbidden").Inc()
		return c, auth.RoleError{Have: c.Role, Need: need}
	}
	return c, nil
}

// rightsOf returns the rights of the request's token (auth.RightsFrom).
func rightsOf(ctx context.Context) *auth.Rights { return auth.RightsFrom(ctx) }

// checkProduce refuses items a token may not push (every item: one refused
// refuses the request, nothing is stored).
func checkProduce(r *auth.Rights, items []queue.PushItem) error {
	if r == nil {
		return nil
	}
	for _, it := range items {
		p := it.Partition
		if p == "" {
			p = queue.DefaultPartition
		}
		if !r.MayProduce(it.Queue, p) {
			return httpapi.Forbiddenf("this token may not produce to %s/%s", it.Queue, p)
		}
	}
	return nil
}

// checkConsume refuses a pop or subscription the token may not make: a
// queue (whole, or one partition) outside its consume patterns, or a
// namespace/task selection outside its namespaces. A selection it may
// make by namespace and task is narrowed to the queues the token may
// consume whole (req.QueueMatch): only those are served.
func checkConsume(r *auth.Rights, req *queue.PopRequest) error {
	if r == nil {
		return nil
	}
	if req.Queue == "" {
		if !r.MayUseNamespace(req.Namespace, req.Task) {
			return httpapi.Forbiddenf("this token may not pop by namespace %q and task %q", req.Namespace, req.Task)
		}
		match, ok := r.WholeQueues()
		if !ok {
			return httpapi.Forbiddenf("this token may consume no whole queue, so none of namespace %q and task %q", req.Namespace, req.Task)
		}
		req.QueueMatch = match
		return nil
	}
	if !r.MayConsume(req.Queue, req.Partition) {
		if req.Partition == "" {
			return httpapi.Forbiddenf("this token may not consume the whole queue %s: name a partition it may read", req.Queue)
		}
		return httpapi.Forbiddenf("this token may not consume %s/%s", req.Queue, req.Partition)
	}
	return nil
}

// An id that names something outside the token's rights (a partition, a
// lease, a resume token's partition) is answered as an id that names
// nothing, at the same cost: it is replaced by nowhere before the store
// sees it, so the store does for it what it does for an unknown id (the
// same statements) and answers the same ("Message not found", "Lease not
// found", 404). The lookup that decides costs the same on both sides too
// (queue.Store.VisiblePartitions, LeasePartitions). Names are different:
// a token's patterns say which names it may use, so a name outside them
// is refused (403) before anything is looked up, whether it exists or not.

// nowhere is the id of nothing: a UUID no partition or lease has (ids are
// random or time-ordered, never all zeros).
const nowhere = zeroUUID

// visible returns the names of the partitions among ids that the token may
// consume (every one that exists, without rights), keyed in lower case.
func (s *Server) visible(ctx context.Context, r *auth.Rights, ids []string) (map[string]queue.PartitionName, error) {
	var allow func(queue.PartitionName) bool
	if r != nil {
		allow = func(n queue.PartitionName) bool { return r.MayConsume(n.Queue, n.Partition) }
	}
	return s.store.VisiblePartitions(ctx, ids, allow)
}

// hidePartition returns id, or nowhere when it names no partition the
// token may consume (names is what visible returned for it).
func hidePartition(id string, names map[string]queue.PartitionName) string {
	if _, ok := names[strings.ToLower(id)]; !ok && queue.ValidUUID(id) {
		return nowhere
	}
	return id
}

// hideAcks makes the acks of messages in partitions the token may not
// consume acks of no partition: a lease id or message learned out of band
// acks nothing, and is answered "Message not found" as an unknown one is.
func (s *Server) hideAcks(ctx context.Context, r *auth.Rights, acks []queue.Ack) error {
	if r == nil {
		return nil
	}
	ids := make([]string, 0, len(acks))
	for _, a := range acks {
		ids = append(ids, a.PartitionID)
	}
	names, err := s.visible(ctx, r, ids)
	if err != nil {
		return err
	}
	for i := range acks {
		acks[i].PartitionID = hidePartition(acks[i].PartitionID, names)
	}
	return nil
}

// hide returns id, or nowhere when it names no partition the token may
// consume (with rights; without, id): for the admin routes, which name one
// partition at a time.
func (s *Server) hide(ctx context.Context, r *auth.Rights, id string) (string, error) {
	if r == nil {
		return id, nil
	}
	names, err := s.visible(ctx, r, []string{id})
	if err != nil {
		return "", err
	}
	return hidePartition(id, names), nil
}

// hideLeases returns leaseIDs with nowhere in place of each lease held on
// a partition the token may not consume: it is not found, as an unknown
// lease is. Without rights it returns leaseIDs.
func (s *Server) hideLeases(ctx context.Context, r *auth.Rights, leaseIDs []string) ([]string, error) {
	if r == nil || len(leaseIDs) == 0 {
		return leaseIDs, nil
	}
	held, err := s.store.LeasePartitions(ctx, leaseIDs)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(leaseIDs))
	for i, id := range leaseIDs {
		out[i] = id
		for _, n := range held[strings.ToLower(id)] {
			if !r.MayConsume(n.Queue, n.Partition) {
				out[i] = nowhere
				break
			}
		}
	}
	return out, nil
}

// hideLease is hideLeases for one lease.
func (s *Server) hideLease(ctx context.Context, r *auth.Rights, leaseID string) (string, error) {
	ids, err := s.hideLeases(ctx, r, []string{leaseID})
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// subjectOf is who the request's bearer is, as its deliveries record it:
// the token's sub, or "" with auth off.
func subjectOf(ctx context.Context) string {
	c, _ := auth.ClaimsFrom(ctx)
	return c.Subject
}

// holderOf is the subject acks, lease extensions and resumes of the
// request are checked against (queue.Ack.Holder): auth.Claims.Holder of
// its token, "" with auth off.
func holderOf(ctx context.Context) string {
	c, _ := auth.ClaimsFrom(ctx)
	return c.Holder()
}
