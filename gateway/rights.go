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

// checkAcks refuses acks of messages in partitions the token may not
// consume: a lease id or message learned out of band acks nothing. An
// unknown partition id is left to the store, which refuses the item.
func (s *Server) checkAcks(ctx context.Context, r *Rights, acks []queue.Ack) error {
	if r == nil {
		return nil
	}
	ids := make([]string, 0, len(acks))
	for _, a := range acks {
		ids = append(ids, a.PartitionID)
	}
	return s.checkPartitions(ctx, r, ids, "acknowledge messages of")
}

// checkLease refuses an extension of a lease held on partitions the token
// may not consume.
func (s *Server) checkLease(ctx context.Context, r *Rights, leaseID string) error {
	if r == nil {
		return nil
	}
	ids, err := s.store.LeasePartitions(ctx, leaseID)
	if err != nil {
		return err
	}
	return s.checkPartitions(ctx, r, ids, "extend a lease on")
}

func (s *Server) checkPartitions(ctx context.Context, r *Rights, ids []string, what string) error {
	names, err := s.store.PartitionNames(ctx, ids)
	if err != nil {
		return err
	}
	for _, id := range ids {
		// Ids come back in PostgreSQL's spelling (lower case); the store
		// reads an id in any case, so the check must too.
		if n, ok := names[strings.ToLower(id)]; ok && !r.MayConsume(n.Queue, n.Partition) {
			return forbidden("this token may not %s %s/%s", what, n.Queue, n.Partition)
		}
	}
	return nil
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
