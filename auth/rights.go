package auth

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
		if !Glob(pa, a) {
			continue
		}
		if !two || pb == "*" {
			return true
		}
		if b != "" && Glob(pb, b) {
			return true
		}
	}
	return false
}

// MaySeeQueue reports whether r lets its bearer read some partition of
// queue (a pattern naming the queue, whole or in part).
func (r *Rights) MaySeeQueue(queue string) bool {
	if r == nil {
		return true
	}
	for _, p := range r.Consume {
		q, _, _ := strings.Cut(p, "/")
		if Glob(q, queue) {
			return true
		}
	}
	return false
}

// WholeQueues is a PostgreSQL regular expression matching the names of
// the queues r lets its bearer consume whole (patterns "queue" and
// "queue/*"); false when there are none.
func (r *Rights) WholeQueues() (string, bool) {
	var alts []string
	for _, p := range r.Consume {
		q, part, two := strings.Cut(p, "/")
		if two && part != "*" {
			continue
		}
		alts = append(alts, GlobRegexp(q))
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

// Glob matches s against pattern, where "*" matches any run of characters
// (none included) and every other character itself.
func Glob(pattern, s string) bool {
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

// Holder is the subject acks, lease extensions and resumes made with c are
// checked against (the store's queue.Ack.Holder): the token's sub, or ""
// for an admin, who may act on any lease, and with auth off (zero
// Claims). A token below admin without a sub holds anonymousHolder,
// which no lease records: it may act only on leases delivered to no
// subject.
func (c Claims) Holder() string {
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

// GlobRegexp is a rights pattern part as a regular expression: "*" matches
// any run of characters, every other character itself. No name holds the
// separator (a control character), so ".*" never runs from the queue into
// the partition.
func GlobRegexp(pattern string) string {
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
