package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/heraldmq/herald/queue"
)

// Rights narrow what a token's role allows to some queues and partitions:
// the "herald" claim of a token,
//
//	{"herald": {"consume": ["mail/alice", "news"], "produce": ["mail/*"], "namespaces": ["tenant-a"]}}
//
// consume and produce list patterns over "queue" (every partition of the
// queue) or "queue/partition" (that partition only); "*" in either part
// matches any run of characters ("mail/*" is every partition of mail, "*"
// every queue). namespaces lists the namespace (or "namespace/task")
// patterns a pop by namespace and task may select. A token without the
// claim is limited by its role alone (nil *Rights).
type Rights struct {
	Consume    []string `json:"consume,omitempty"`
	Produce    []string `json:"produce,omitempty"`
	Namespaces []string `json:"namespaces,omitempty"`
}

// Bounds of the claim.
const (
	maxRightsPatterns = 256 // per list
	maxPatternBytes   = 512
)

// ErrBadRights: the herald claim is not of the documented shape.
var ErrBadRights = errors.New(`the bearer token's "herald" claim is not {"consume":[patterns],"produce":[patterns],"namespaces":[patterns]}`)

// ParseRights reads the herald claim. Unknown fields, a pattern that is
// empty, too long or has more than one "/", and lists over the bound are
// refused: a token that says something Herald cannot read grants nothing.
func ParseRights(raw []byte) (*Rights, error) {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	var r Rights
	if err := dec.Decode(&r); err != nil || dec.More() {
		return nil, ErrBadRights
	}
	for _, list := range [][]string{r.Consume, r.Produce, r.Namespaces} {
		if len(list) > maxRightsPatterns {
			return nil, fmt.Errorf("%w: more than %d patterns in a list", ErrBadRights, maxRightsPatterns)
		}
		for _, p := range list {
			q, part, two := strings.Cut(p, "/")
			if p == "" || len(p) > maxPatternBytes || q == "" || (two && (part == "" || strings.Contains(part, "/"))) {
				return nil, fmt.Errorf("%w: bad pattern %q", ErrBadRights, p)
			}
		}
	}
	return &r, nil
}

// MayConsume reports whether r lets its bearer read partition of queue;
// partition "" asks for the whole queue (a pop or subscription that names
// no partition), which only a pattern covering every partition grants.
func (r *Rights) MayConsume(queue, partition string) bool {
	return r == nil || allows(r.Consume, queue, partition)
}

// MayProduce reports whether r lets its bearer push to partition of queue.
func (r *Rights) MayProduce(queue, partition string) bool {
	return r == nil || allows(r.Produce, queue, partition)
}

// MayUseNamespace reports whether r lets a pop select queues by namespace
// and task (either may be empty: any).
func (r *Rights) MayUseNamespace(namespace, task string) bool {
	if r == nil {
		return true
	}
	return allows(r.Namespaces, namespace, task)
}

// allows matches (a, b) against patterns "A" (any b) or "A/B"; b == ""
// needs a pattern whose second part matches anything.
func allows(patterns []string, a, b string) bool {
	for _, p := range patterns {
		pa, pb, two := strings.Cut(p, "/")
		if !glob(pa, a) {
			continue
		}
		if !two || pb == "*" {
			return true
		}
		if b != "" && glob(pb, b) {
			return true
		}
	}
	return false
}

// wholeQueues is a PostgreSQL regular expression matching the names of
// the queues r lets its bearer consume whole (patterns "queue" and
// "queue/*"); false when there are none.
func (r *Rights) wholeQueues() (string, bool) {
	var alts []string
	for _, p := range r.Consume {
		q, part, two := strings.Cut(p, "/")
		if two && part != "*" {
			continue
		}
		alts = append(alts, globRegexp(q))
	}
	if len(alts) == 0 {
		return "", false
	}
	return "^(?:" + strings.Join(alts, "|") + ")$", true
}

// isAlnum reports whether c is an ASCII letter or digit.
func isAlnum(c rune) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// glob matches s against pattern, where "*" matches any run of characters
// (none included) and every other character itself.
func glob(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == s
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(s, mid)
		if i < 0 {
			return false
		}
		s = s[i+len(mid):]
	}
	return strings.HasSuffix(s, last)
}

// rightsOf returns the rights of the request's token: nil with auth off or
// a token without the claim.
func rightsOf(ctx context.Context) *Rights {
	if c, ok := claimsOf(ctx); ok {
		return c.Rights
	}
	return nil
}

// forbidden answers 403 with why.
func forbidden(format string, args ...any) error {
	return &badRequest{status: http.StatusForbidden, msg: fmt.Sprintf(format, args...)}
}

// checkProduce refuses items a token may not push (every item: one refused
// refuses the request, nothing is stored).
func checkProduce(r *Rights, items []queue.PushItem) error {
	if r == nil {
		return nil
	}
	for _, it := range items {
		p := it.Partition
		if p == "" {
			p = queue.DefaultPartition
		}
		if !r.MayProduce(it.Queue, p) {
			return forbidden("this token may not produce to %s/%s", it.Queue, p)
		}
	}
	return nil
}

// checkConsume refuses a pop or subscription the token may not make: a
// queue (whole, or one partition) outside its consume patterns, or a
// namespace/task selection outside its namespaces. A selection it may
// make by namespace and task is narrowed to the queues the token may
// consume whole (req.QueueMatch): only those are served.
func checkConsume(r *Rights, req *queue.PopRequest) error {
	if r == nil {
		return nil
	}
	if req.Queue == "" {
		if !r.MayUseNamespace(req.Namespace, req.Task) {
			return forbidden("this token may not pop by namespace %q and task %q", req.Namespace, req.Task)
		}
		match, ok := r.wholeQueues()
		if !ok {
			return forbidden("this token may consume no whole queue, so none of namespace %q and task %q", req.Namespace, req.Task)
		}
		req.QueueMatch = match
		return nil
	}
	if !r.MayConsume(req.Queue, req.Partition) {
		if req.Partition == "" {
			return forbidden("this token may not consume the whole queue %s: name a partition it may read", req.Queue)
		}
		return forbidden("this token may not consume %s/%s", req.Queue, req.Partition)
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
func (s *Server) visible(ctx context.Context, r *Rights, ids []string) (map[string]queue.PartitionName, error) {
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
func (s *Server) hideAcks(ctx context.Context, r *Rights, acks []queue.Ack) error {
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

// hideLeases returns leaseIDs with nowhere in place of each lease held on
// a partition the token may not consume: it is not found, as an unknown
// lease is. Without rights it returns leaseIDs.
func (s *Server) hideLeases(ctx context.Context, r *Rights, leaseIDs []string) ([]string, error) {
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
func (s *Server) hideLease(ctx context.Context, r *Rights, leaseID string) (string, error) {
	ids, err := s.hideLeases(ctx, r, []string{leaseID})
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// subjectOf is who the request's bearer is, as its deliveries record it:
// the token's sub, or "" with auth off.
func subjectOf(ctx context.Context) string {
	c, _ := claimsOf(ctx)
	return c.Subject
}

// holderOf is the subject acks, lease extensions and resumes of the
// request are checked against (queue.Ack.Holder): the bearer's sub,
// unless auth is off or the bearer is an admin, who may act on any lease.
func holderOf(ctx context.Context) string {
	c, _ := claimsOf(ctx)
	return c.holder()
}

// holder is holderOf for claims at hand. A token below admin without a
// sub holds anonymousHolder, which no lease records: it may act only on
// leases delivered to no subject.
func (c Claims) holder() string {
	switch {
	case c.Role >= RoleAdmin || c.Role == RoleNone: // an admin; auth off (a verified token has a role)
		return ""
	case c.Subject == "":
		return anonymousHolder
	}
	return c.Subject
}

// anonymousHolder is the holder of a token without sub (a control
// character first: no identity provider issues it as a sub).
const anonymousHolder = "\x01herald:no-subject"

// globRegexp is a rights pattern part as a regular expression: "*" matches
// any run of characters, every other character itself. No name holds the
// separator (a control character), so ".*" never runs from the queue into
// the partition.
func globRegexp(pattern string) string {
	var b strings.Builder
	for _, c := range pattern {
		switch {
		case c == '*':
			b.WriteString(".*")
		case c < 0x80 && !isAlnum(c):
			b.WriteByte('\\') // a backslash before any other character is that character
			b.WriteRune(c)
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}
