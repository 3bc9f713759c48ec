package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// Subprotocol is the WebSocket subprotocol the client speaks.
const Subprotocol = "herald.v1"

// Defaults of Options.
const (
	MinBackoffDefault = 100 * time.Millisecond
	MaxBackoffDefault = 10 * time.Second
	// readTimeout: the server pings every 30 s; silence longer than this
	// means the connection is dead even if TCP has not noticed.
	readTimeout  = 75 * time.Second
	writeTimeout = 10 * time.Second
)

// Options configure a Client. The zero value works against a server with
// auth off.
type Options struct {
	// Token is a bearer token (a JWT) sent on every request.
	Token string
	// TokenSource, when set, is asked for the token instead of Token: on
	// every connection (so a reconnect, and a connection the server closed
	// with 4501 because its token expired, gets a fresh one), on every push,
	// and before the live connection's token expires (it is then sent in an
	// auth frame, and the connection stays up). Cache in it as needed.
	TokenSource func(ctx context.Context) (string, error)
	// HTTPClient sends pushes; nil means a client with a 30 s timeout.
	HTTPClient *http.Client
	// MinBackoff and MaxBackoff bound the delay between reconnect attempts,
	// which doubles from MinBackoff with full jitter.
	MinBackoff, MaxBackoff time.Duration
	// OnState, when set, is told about connection changes: StateConnected,
	// StateReconnecting (with the error that ended the connection, the
	// attempt number and the delay before it) and StateClosed.
	OnState func(State)
}

// State is a change of the client's connection.
type State struct {
	Kind    StateKind
	Err     error
	Attempt int
	Delay   time.Duration
}

// StateKind says what happened to the connection.
type StateKind int

// Connection states.
const (
	StateConnected StateKind = iota
	StateReconnecting
	StateClosed
)

// CloseError is a close frame from the server. Codes 4000–4499 allow a
// reconnect (the client does it); 4500–4999 are terminal (bad token,
// protocol error) and end every subscription with this error.
type CloseError struct {
	Code   int
	Reason string
}

func (e *CloseError) Error() string {
	return fmt.Sprintf("herald closed the connection: %d %s", e.Code, e.Reason)
}

// Terminal reports whether reconnecting cannot help.
func (e *CloseError) Terminal() bool { return e.Code >= 4500 && e.Code <= 4999 }

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = errors.New("herald client closed")

// Client is a connection to one Herald server (or a load balancer in front
// of several). It is safe for concurrent use.
type Client struct {
	base   *url.URL
	wsURL  string
	opts   Options
	http   *http.Client
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	conn     *conn // nil while reconnecting
	subs     map[*Subscription]bool
	follows  map[*Follow]bool
	terminal error
}

// Dial connects to the server at rawURL (http://host:port) and keeps the
// connection up until Close. It fails when the first connection cannot be
// made; later failures are retried.
func Dial(ctx context.Context, rawURL string, opts Options) (*Client, error) {
	base, err := url.Parse(strings.TrimSuffix(rawURL, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("herald: %q is not an http(s) URL", rawURL)
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = MinBackoffDefault
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(MaxBackoffDefault, opts.MinBackoff)
	}
	ws := *base
	ws.Scheme = map[string]string{"http": "ws", "https": "wss"}[base.Scheme]
	ws.Path += "/api/v1/ws"
	c := &Client{base: base, wsURL: ws.String(), opts: opts, http: opts.HTTPClient,
		done: make(chan struct{}), subs: map[*Subscription]bool{}, follows: map[*Follow]bool{}}
	if c.http == nil {
		c.http = &http.Client{Timeout: 30 * time.Second}
	}
	first, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	go c.run(first)
	return c, nil
}

// Close ends every subscription and the connection.
func (c *Client) Close() error {
	c.cancel()
	<-c.done
	return nil
}

func (c *Client) state(s State) {
	if c.opts.OnState != nil {
		c.opts.OnState(s)
	}
}

// token is the bearer token to send now: TokenSource's, else Token.
func (c *Client) token(ctx context.Context) (string, error) {
	if c.opts.TokenSource == nil {
		return c.opts.Token, nil
	}
	t, err := c.opts.TokenSource(ctx)
	if err != nil {
		return "", fmt.Errorf("herald: token source: %w", err)
	}
	return t, nil
}

func (c *Client) dial(ctx context.Context) (*conn, error) {
	d := websocket.Dialer{Subprotocols: []string{Subprotocol}, HandshakeTimeout: 10 * time.Second}
	h := http.Header{}
	tok, err := c.token(ctx)
	if err != nil {
		return nil, err
	}
	if tok != "" {
		h.Set("Authorization", "Bearer "+tok)
	}
	ws, res, err := d.DialContext(ctx, c.wsURL, h)
	if res != nil && res.Body != nil {
		_ = res.Body.Close()
	}
	if err != nil {
		if res != nil {
			return nil, fmt.Errorf("herald: connecting to %s: %s", c.wsURL, res.Status)
		}
		return nil, fmt.Errorf("herald: connecting to %s: %w", c.wsURL, err)
	}
	cn := newConn(c, ws)
	cn.expires = tokenExpiry(tok)
	return cn, nil
}

// tokenExpiry reads a JWT's exp without verifying it (the server does):
// zero when it has none or cannot be read.
func tokenExpiry(tok string) time.Time {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}
	}
	var claims struct {
		Exp float64 `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil || claims.Exp <= 0 {
		return time.Time{}
	}
	return time.Unix(int64(claims.Exp), 0)
}

// refresh sends cn a fresh token from TokenSource before its token
// expires (at 80% of the time left, retrying until a second before exp),
// until cn ends. Without a TokenSource, or a token without exp, it does
// nothing: the server closes the connection at exp.
func (c *Client) refresh(cn *conn) {
	if c.opts.TokenSource == nil {
		return
	}
	for exp := cn.expires; !exp.IsZero(); {
		wait := time.Until(exp) * 4 / 5
		if wait < 0 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-cn.gone:
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
		tok, err := c.token(ctx)
		if err == nil {
			_, err = cn.request(ctx, map[string]any{"type": "auth", "token": tok}, nil)
		}
		cancel()
		if err == nil {
			exp = tokenExpiry(tok)
		} else if time.Until(exp) < time.Second {
			return // the server closes it at exp; the reconnect asks for a token again
		}
	}
}

// run keeps a connection up: it serves one until it fails, then dials
// again with back-off and resubscribes.
func (c *Client) run(cn *conn) {
	defer close(c.done)
	attempt := 0
	for {
		c.mu.Lock()
		c.conn = cn
		subs := make([]*Subscription, 0, len(c.subs))
		for s := range c.subs {
			subs = append(subs, s)
		}
		follows := make([]*Follow, 0, len(c.follows))
		for f := range c.follows {
			follows = append(follows, f)
		}
		c.mu.Unlock()
		c.state(State{Kind: StateConnected})
		for _, s := range subs {
			go s.attach(c.ctx, cn)
		}
		for _, f := range follows {
			go f.attach(c.ctx, cn)
		}
		go c.refresh(cn)
		err := cn.serve(c.ctx)
		c.mu.Lock()
		c.conn = nil
		c.mu.Unlock()
		for _, s := range subs {
			s.detach(cn)
		}
		for _, f := range follows {
			f.detach(cn)
		}
		if c.ctx.Err() != nil {
			c.finish(ErrClosed)
			return
		}
		var ce *CloseError
		// An expired token ends the connection with 4501: with a token
		// source, the reconnect asks it for a fresh one.
		expired := errors.As(err, &ce) && ce.Code == 4501 && c.opts.TokenSource != nil
		if errors.As(err, &ce) && ce.Terminal() && !expired {
			c.finish(err)
			return
		}
		attempt = 0
		for {
			attempt++
			delay := backoff(c.opts.MinBackoff, c.opts.MaxBackoff, attempt)
			c.state(State{Kind: StateReconnecting, Err: err, Attempt: attempt, Delay: delay})
			t := time.NewTimer(delay)
			select {
			case <-c.ctx.Done():
				t.Stop()
				c.finish(ErrClosed)
				return
			case <-t.C:
			}
			if cn, err = c.dial(c.ctx); err == nil {
				break
			}
		}
	}
}

// join adds a subscription or follow (add, called under c.mu) unless the
// client has ended, and returns the connection to start it on now (nil
// while the client reconnects: the reconnection starts it) or the error
// the client ended with.
func (c *Client) join(add func()) (*conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.terminal != nil {
		return nil, c.terminal
	}
	add()
	return c.conn, nil
}

// finish ends every subscription and follow with err.
func (c *Client) finish(err error) {
	c.mu.Lock()
	c.terminal = err
	subs, follows := c.subs, c.follows
	c.subs, c.follows = map[*Subscription]bool{}, map[*Follow]bool{}
	c.mu.Unlock()
	for s := range subs {
		s.end(err)
	}
	for f := range follows {
		f.end(err)
	}
	c.state(State{Kind: StateClosed, Err: err})
}

// backoff is the delay before a reconnect attempt: exponential, capped, with
// full jitter so that many clients spread out.
func backoff(lo, hi time.Duration, attempt int) time.Duration {
	d := lo << min(attempt-1, 30)
	if d <= 0 || d > hi {
		d = hi
	}
	return lo/2 + rand.N(d-lo/2+1) // #nosec G404 -- jitter, not a secret
}

// PushItem is one message to push.
type PushItem struct {
	Queue     string `json:"queue"`
	Partition string `json:"partition,omitempty"`
	// Payload is marshalled to JSON; a json.RawMessage is sent as is.
	Payload       any    `json:"payload"`
	TransactionID string `json:"transactionId,omitempty"`
	TraceID       string `json:"traceId,omitempty"`
}

// PushResult reports one pushed item.
type PushResult struct {
	Index         int    `json:"index"`
	Status        string `json:"status"` // queued or duplicate
	MessageID     string `json:"message_id"`
	PartitionID   string `json:"partition_id"`
	TransactionID string `json:"transaction_id"`
	Error         string `json:"error,omitempty"`
}

// Push stores items over HTTP in one request and reports each; a duplicate
// transaction id is a result, not an error.
func (c *Client) Push(ctx context.Context, items ...PushItem) ([]PushResult, error) {
	body, err := json.Marshal(map[string]any{"items": items})
	if err != nil {
		return nil, fmt.Errorf("herald: encoding push: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base.String()+"/api/v1/push", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	tok, err := c.token(ctx)
	if err != nil {
		return nil, err
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("herald: push: %w", err)
	}
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, fmt.Errorf("herald: push: %w", err)
	}
	if res.StatusCode != http.StatusCreated {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		return nil, &HTTPError{Status: res.StatusCode, Message: e.Error}
	}
	var out []PushResult
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("herald: push answer: %w", err)
	}
	return out, nil
}

// HTTPError is a refused request.
type HTTPError struct {
	Status  int
	Message string
}

func (e *HTTPError) Error() string {
	return "herald: " + strconv.Itoa(e.Status) + " " + http.StatusText(e.Status) + ": " + e.Message
}
