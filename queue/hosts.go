package queue

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Hung hosts. A host that stopped answering (a frozen primary, a
// black-holed machine) may still accept TCP connections in its kernel, so
// nothing fails fast: every new connection waits the connect timeout on it
// before pgx tries the next host of a multi-host URL; connections in use
// wait for their statements' deadlines; and pgx ends each of those by
// sending a cancel request to the same host and reading what is left on
// the connection, waiting up to 15 s for each while the pool keeps the
// connection's slot. Measured with a SIGSTOPped primary and a promoted
// standby: pushes came back after 20-26 s. A hostTracker (one per pool,
// set up by ParsePoolConfig) shortens all of it:
//
//   - an attempt at an address that goes unanswered (a dial that fails, a
//     connection's startup with no answer by the connect timeout, a cancel
//     request not acknowledged within cancelAnswerWait) marks the address
//     failed, unless another connection to it read something since the
//     attempt was sent (the server answers, slowly);
//   - new connections try the URL's other hosts first while an address is
//     marked, until a connection to it is answered again (BeforeConnect);
//   - with a multi-host URL, marking closes every connection to the
//     address: the statements waiting on them fail at once, and the pool
//     drops the idle ones when they are next taken (PrepareConn) rather
//     than running a request on them. With one host there is nowhere else
//     to go, and they are left alone;
//   - the wait for a cancel request's acknowledgement, and for the end of
//     a connection pgx closes after an interrupted statement, is at most
//     cancelAnswerWait, and none at a marked address. The cancel request
//     is sent either way: the server acts on it when it reads it.
//
// The first statement to time out on a hung host (a /health ping: 2 s)
// thus leads to leaving it about cancelAnswerWait later.
type hostTracker struct {
	mu       sync.Mutex
	resolved map[string][]string     // host name → what its last lookup returned ("ip" or "ip:port")
	failed   map[string]time.Time    // dial address → when an attempt there last went unanswered
	conns    map[*trackedConn]string // open connections → their dial address
	// multi: the URL names more than one host, so there is somewhere else
	// to go; with one, connections to it are not dropped for a failed
	// attempt (an overloaded server would only get more connects).
	multi bool
	// connectTimeout bounds every dial (a cancel request's too, which pgx
	// gives 15 s): the pool's ConnectTimeout, as BeforeConnect saw it.
	connectTimeout atomic.Int64
}

// cancelAnswerWait bounds the wait for a server to acknowledge a cancel
// request (pgx waits up to 15 s, holding the pool's slot of the
// connection it ends). A healthy server answers in a millisecond.
const cancelAnswerWait = 2 * time.Second

func newHostTracker() *hostTracker {
	return &hostTracker{resolved: map[string][]string{}, failed: map[string]time.Time{}, conns: map[*trackedConn]string{}}
}

// install hooks the tracker into cfg: its dialer, lookup, BeforeConnect
// and PrepareConn.
func (h *hostTracker) install(cfg *pgxpool.Config, dial pgconn.DialFunc) {
	cc := cfg.ConnConfig
	for _, fb := range cc.Fallbacks {
		if fb.Host != cc.Host || fb.Port != cc.Port {
			h.multi = true
		}
	}
	lookup := cc.LookupFunc
	cc.LookupFunc = func(ctx context.Context, host string) ([]string, error) {
		addrs, err := lookup(ctx, host)
		if err == nil {
			h.mu.Lock()
			h.resolved[host] = addrs
			h.mu.Unlock()
		}
		return addrs, err
	}
	cc.DialFunc = h.dialer(dial)
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		h.connectTimeout.Store(int64(cc.ConnectTimeout))
		h.order(&cc.Config)
		return nil
	}
	cfg.PrepareConn = func(_ context.Context, c *pgx.Conn) (bool, error) {
		tc := connUnder[*trackedConn](c.PgConn().Conn())
		return tc == nil || !tc.dead.Load(), nil
	}
}

// dialer wraps dial: a failed dial marks its address, and every
// connection is tracked.
func (h *hostTracker) dialer(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		at := time.Now()
		if d := time.Duration(h.connectTimeout.Load()); d > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
				h.fail(addr, at)
			}
			return nil, err
		}
		tc := &trackedConn{Conn: c, h: h, addr: addr, dialedAt: at}
		h.mu.Lock()
		h.conns[tc] = addr
		h.mu.Unlock()
		return tc, nil
	}
}

// fail notes that an attempt at addr (a connection's startup, a cancel
// request, a dial) sent at sent went unanswered. Unless another connection
// to addr read something since (the server answers, slowly), new
// connections try the other hosts first until it answers again, and, with
// a multi-host URL, every connection to it is closed: the statements
// waiting on them fail now instead of at their deadlines, and the pool
// drops the idle ones when they are next taken (PrepareConn).
func (h *hostTracker) fail(addr string, sent time.Time) {
	h.mu.Lock()
	var open []*trackedConn
	for tc, a := range h.conns {
		if a != addr || tc.cancel.Load() {
			continue
		}
		if tc.lastRead.Load() > sent.UnixNano() {
			h.mu.Unlock()
			return
		}
		open = append(open, tc)
	}
	h.failed[addr] = time.Now()
	multi := h.multi
	h.mu.Unlock()
	if !multi {
		return
	}
	for _, tc := range open {
		tc.dead.Store(true)
		_ = tc.Conn.Close() // a read waiting on it fails at once; pgx ends the connection
	}
}

// answered notes that addr answers: it takes its place in the URL's
// order again.
func (h *hostTracker) answered(addr string) {
	h.mu.Lock()
	delete(h.failed, addr)
	h.mu.Unlock()
}

func (h *hostTracker) isFailed(addr string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.failed[addr]
	return ok
}

// order puts the hosts of c (its host and fallbacks) that answer before
// those where an attempt went unanswered, the longest unanswered first;
// otherwise the URL's order holds.
func (h *hostTracker) order(c *pgconn.Config) {
	if len(c.Fallbacks) == 0 {
		return
	}
	all := append([]*pgconn.FallbackConfig{{Host: c.Host, Port: c.Port, TLSConfig: c.TLSConfig}}, c.Fallbacks...)
	h.mu.Lock()
	if len(h.failed) == 0 {
		h.mu.Unlock()
		return
	}
	since := make(map[*pgconn.FallbackConfig]time.Time, len(all))
	for _, fb := range all {
		for _, a := range h.addresses(fb) {
			if t, ok := h.failed[a]; ok && t.After(since[fb]) {
				since[fb] = t
			}
		}
	}
	h.mu.Unlock()
	slices.SortStableFunc(all, func(a, b *pgconn.FallbackConfig) int { return since[a].Compare(since[b]) })
	c.Host, c.Port, c.TLSConfig = all[0].Host, all[0].Port, all[0].TLSConfig
	c.Fallbacks = all[1:]
}

// addresses are the dial addresses of fb, per its last lookup (h.mu held).
func (h *hostTracker) addresses(fb *pgconn.FallbackConfig) []string {
	ips, ok := h.resolved[fb.Host]
	if !ok {
		ips = []string{fb.Host} // not looked up yet: a literal, or a socket path
	}
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		if _, _, err := net.SplitHostPort(ip); err == nil {
			out = append(out, ip)
			continue
		}
		_, a := pgconn.NetworkAddress(ip, fb.Port)
		out = append(out, a)
	}
	return out
}

// trackedConn is a connection the tracker watches.
type trackedConn struct {
	net.Conn
	h        *hostTracker
	addr     string
	dialedAt time.Time

	sentAt    atomic.Int64 // its first write, unix ns
	lastRead  atomic.Int64 // its last read that got bytes, unix ns; 0: none yet
	cancel    atomic.Bool  // a cancel request's connection
	dead      atomic.Bool  // closed by fail: the pool drops it
	closeOnce sync.Once
}

// NetConn is the connection c watches.
func (c *trackedConn) NetConn() net.Conn { return c.Conn }

func (c *trackedConn) Write(b []byte) (int, error) {
	first := c.sentAt.Load() == 0
	if first {
		c.sentAt.Store(time.Now().UnixNano())
	}
	cancel := first && isCancelRequest(b)
	if cancel {
		c.cancel.Store(true)
	}
	if cancel || string(b) == terminate {
		// A cancel request's acknowledgement, or the end of what a
		// connection pgx closes after an interrupted statement sent (it
		// reads until then, up to 15 s): a short wait, none on a host
		// that failed.
		wait := cancelAnswerWait
		if c.h.isFailed(c.addr) {
			wait = 0
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
	}
	return c.Conn.Write(b)
}

// terminate is the Terminate message, written alone when pgx closes a
// connection.
const terminate = "X\x00\x00\x00\x04"

func (c *trackedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		if c.lastRead.Swap(time.Now().UnixNano()) == 0 {
			c.h.answered(c.addr)
		}
	}
	var ne net.Error
	if err != nil && c.lastRead.Load() == 0 && !c.dead.Load() && errors.As(err, &ne) && ne.Timeout() {
		// Nothing came before the deadline: a connection attempt (pgx's
		// connect timeout) or a cancel request (cancelAnswerWait) the
		// server left unanswered.
		sent := c.dialedAt
		if s := c.sentAt.Load(); s != 0 {
			sent = time.Unix(0, s)
		}
		c.h.fail(c.addr, sent)
	}
	return n, err
}

func (c *trackedConn) Close() error {
	c.closeOnce.Do(func() {
		c.h.mu.Lock()
		delete(c.h.conns, c)
		c.h.mu.Unlock()
	})
	return c.Conn.Close()
}

// isCancelRequest reports whether b is a CancelRequest message: its
// length, then the code 80877102.
func isCancelRequest(b []byte) bool {
	return len(b) >= 12 && int(binary.BigEndian.Uint32(b[0:4])) == len(b) &&
		binary.BigEndian.Uint32(b[4:8]) == 80877102
}

// connUnder finds the connection of type T under c, unwrapping through
// NetConn (TLS, the host tracker's trackedConn), or T's zero value.
func connUnder[T net.Conn](c net.Conn) T {
	for c != nil {
		if t, ok := c.(T); ok {
			return t
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	var none T
	return none
}
