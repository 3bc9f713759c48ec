package client

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// frame is every server frame; fields unused by a type stay zero.
type frame struct {
	Type     string          `json:"type"`
	ID       json.RawMessage `json:"id"`
	Sub      string          `json:"sub"`
	Messages []*Message      `json:"messages"`
	Code     string          `json:"code"`
	Message  string          `json:"message"`
	Results  json.RawMessage `json:"results"`
	// follows
	Follow      string  `json:"follow"`
	LastEventID string  `json:"lastEventId"`
	GoneThrough string  `json:"goneThrough"`
	NextEventID *string `json:"nextEventId"`
}

// ServerError is an error frame answering a request.
type ServerError struct {
	Code, Message string
}

func (e *ServerError) Error() string { return "herald: " + e.Code + ": " + e.Message }

// errConnLost means the connection ended before the frame was sent.
var errConnLost = errors.New("herald: connection lost")

// errNoAnswer means the frame was sent but the connection ended before the
// server answered: it may or may not have been applied.
var errNoAnswer = errors.New("herald: connection lost before the answer")

// conn is one WebSocket connection: a reader that routes deliveries to
// subscriptions and replies to requests, and a write lock.
type conn struct {
	c  *Client
	ws *websocket.Conn

	wmu sync.Mutex // gorilla allows one writer at a time

	mu      sync.Mutex
	nextID  int64
	pending map[string]*request
	subs    map[string]*Subscription // server sub id → subscription
	follows map[string]*Follow       // server follow id → follow
	gone    chan struct{}
	err     error
	expires time.Time // of the token it was opened with (or last sent in an auth frame); zero: none
}

type request struct {
	reply  chan frame
	sub    *Subscription // for subscribe: routed before any delivery is read
	follow *Follow       // for follow: the same
}

func newConn(c *Client, ws *websocket.Conn) *conn {
	return &conn{c: c, ws: ws, pending: map[string]*request{}, subs: map[string]*Subscription{},
		follows: map[string]*Follow{}, gone: make(chan struct{})}
}

// serve reads frames until the connection fails or ctx ends.
func (cn *conn) serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		cn.wmu.Lock()
		_ = cn.ws.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		cn.wmu.Unlock()
		_ = cn.ws.Close()
	})
	defer stop()
	_ = cn.ws.SetReadDeadline(time.Now().Add(readTimeout))
	cn.ws.SetPingHandler(func(data string) error {
		_ = cn.ws.SetReadDeadline(time.Now().Add(readTimeout))
		cn.wmu.Lock()
		defer cn.wmu.Unlock()
		err := cn.ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(writeTimeout))
		if errors.Is(err, websocket.ErrCloseSent) {
			return nil
		}
		return err
	})
	var err error
	for {
		var data []byte
		if _, data, err = cn.ws.ReadMessage(); err != nil {
			break
		}
		_ = cn.ws.SetReadDeadline(time.Now().Add(readTimeout))
		var f frame
		if json.Unmarshal(data, &f) != nil {
			continue // not ours to judge: skip what we cannot read
		}
		cn.route(&f)
	}
	_ = cn.ws.Close()
	var ce *websocket.CloseError
	if errors.As(err, &ce) && ce.Code >= 4000 {
		err = &CloseError{Code: ce.Code, Reason: ce.Text}
	}
	cn.mu.Lock()
	cn.err = err
	close(cn.gone)
	cn.mu.Unlock()
	return err
}

func (cn *conn) route(f *frame) {
	switch {
	case f.Type == "follow_deliver" || f.Type == "follow_gap":
		cn.mu.Lock()
		fl := cn.follows[f.Follow]
		cn.mu.Unlock()
		if fl == nil {
			return
		}
		if f.Type == "follow_gap" {
			g := Gap{GoneThrough: f.GoneThrough}
			if f.NextEventID != nil {
				g.NextEventID = *f.NextEventID
			}
			fl.gap(g)
			return
		}
		fl.deliver(f.Messages)
		return
	case f.Type == "error" && f.Follow != "":
		// A follow the server ended (a fresh token no longer allows it).
		cn.mu.Lock()
		fl := cn.follows[f.Follow]
		delete(cn.follows, f.Follow)
		cn.mu.Unlock()
		if fl != nil {
			fl.end(&ServerError{Code: f.Code, Message: f.Message})
		}
		return
	}
	if f.Type == "deliver" {
		cn.mu.Lock()
		s := cn.subs[f.Sub]
		cn.mu.Unlock()
		if s != nil {
			for _, m := range f.Messages {
				m.cn, m.sub = cn, s
				select {
				case s.msgs <- m: // room for 2×maxInFlight: the server's credit bounds it
				case <-s.left:
				}
			}
		}
		return
	}
	id := string(f.ID)
	cn.mu.Lock()
	req := cn.pending[id]
	delete(cn.pending, id)
	if req != nil && req.sub != nil && f.Type == "subscribed" {
		cn.subs[f.Sub] = req.sub
	}
	if req != nil && req.follow != nil && f.Type == "followed" {
		cn.follows[f.Follow] = req.follow
	}
	cn.mu.Unlock()
	if req != nil && req.follow != nil && f.Type == "followed" {
		req.follow.started(cn, f.LastEventID)
	}
	if req != nil {
		req.reply <- *f
	}
}

// send writes a frame with a fresh id; reply, when set, receives the answer.
func (cn *conn) send(body map[string]any, req *request) error {
	cn.mu.Lock()
	cn.nextID++
	id := strconv.FormatInt(cn.nextID, 10)
	if req != nil {
		cn.pending[id] = req
	}
	cn.mu.Unlock()
	body["id"] = json.RawMessage(id) // a JSON number, echoed as is
	cn.wmu.Lock()
	_ = cn.ws.SetWriteDeadline(time.Now().Add(writeTimeout))
	err := cn.ws.WriteJSON(body)
	cn.wmu.Unlock()
	if err != nil {
		cn.mu.Lock()
		delete(cn.pending, id)
		cn.mu.Unlock()
		_ = cn.ws.Close()
		return errConnLost
	}
	return nil
}

// request sends a frame and waits for its answer. An error frame becomes a
// *ServerError.
func (cn *conn) request(ctx context.Context, body map[string]any, sub *Subscription) (frame, error) {
	return cn.await(ctx, body, &request{reply: make(chan frame, 1), sub: sub})
}

// requestFollow is request for a follow frame.
func (cn *conn) requestFollow(ctx context.Context, body map[string]any, fl *Follow) (frame, error) {
	return cn.await(ctx, body, &request{reply: make(chan frame, 1), follow: fl})
}

func (cn *conn) await(ctx context.Context, body map[string]any, req *request) (frame, error) {
	if err := cn.send(body, req); err != nil {
		return frame{}, err
	}
	select {
	case f := <-req.reply:
		if f.Type == "error" {
			return f, &ServerError{Code: f.Code, Message: f.Message}
		}
		return f, nil
	case <-cn.gone:
		return frame{}, errNoAnswer
	case <-ctx.Done():
		return frame{}, ctx.Err()
	}
}

func (cn *conn) alive() bool {
	select {
	case <-cn.gone:
		return false
	default:
		return true
	}
}
