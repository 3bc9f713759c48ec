package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/centrifugal/centrifuge"
	"github.com/gorilla/websocket"

	"github.com/heraldmq/herald/internal/benchstat"
)

// centrifugeSys is a centrifuge Node (memory broker) in a child process
// with an HTTP publish endpoint, as Centrifugo's server API is; one
// WebSocket client subscribes to a channel. Centrifuge has no acks: a
// message is delivered at most once to the connected client.
type centrifugeSys struct{ childSys }

func startCentrifuge(ctx context.Context, self string) (*centrifugeSys, error) {
	cs, err := startChildSys(ctx, self, "centrifuge")
	if err != nil {
		return nil, err
	}
	return &centrifugeSys{cs}, nil
}

func (s *centrifugeSys) name() string { return "centrifuge" }

func (s *centrifugeSys) run(ctx context.Context, rate int, warm, dur time.Duration) (sample, error) {
	s.n++
	channel := fmt.Sprintf("peers-%d-%d", rate, s.n)
	rec := benchstat.NewRecorder(runLength(rate, warm, dur))
	ws, res, err := websocket.DefaultDialer.DialContext(ctx, "ws://"+s.ch.addr+"/connection/websocket", nil)
	if res != nil {
		_ = res.Body.Close()
	}
	if err != nil {
		return sample{}, fmt.Errorf("dialing centrifuge: %w", err)
	}
	defer func() { _ = ws.Close() }()
	for i, cmd := range []string{`{"id":1,"connect":{"name":"peers"}}`,
		fmt.Sprintf(`{"id":2,"subscribe":{"channel":%q}}`, channel)} {
		if err := ws.WriteMessage(websocket.TextMessage, []byte(cmd)); err != nil {
			return sample{}, fmt.Errorf("sending %s: %w", cmd, err)
		}
		_, b, err := ws.ReadMessage()
		if err != nil {
			return sample{}, fmt.Errorf("reading the answer to %s: %w", cmd, err)
		}
		if !bytes.Contains(b, fmt.Appendf(nil, `"id":%d`, i+1)) || bytes.Contains(b, []byte(`"error"`)) {
			return sample{}, fmt.Errorf("centrifuge answered %s with %s", cmd, b)
		}
	}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for {
			_, b, err := ws.ReadMessage()
			if err != nil {
				return
			}
			now := time.Now()
			// One frame may carry several newline-separated replies.
			for line := range bytes.SplitSeq(b, []byte("\n")) {
				if string(line) == "{}" { // a ping: answer with a pong
					_ = ws.WriteMessage(websocket.TextMessage, []byte("{}"))
					continue
				}
				var r struct {
					Push struct {
						Pub struct {
							Data json.RawMessage `json:"data"`
						} `json:"pub"`
					} `json:"push"`
				}
				if json.Unmarshal(line, &r) == nil && r.Push.Pub.Data != nil {
					rec.RecordJSON(r.Push.Pub.Data, now)
				}
			}
		}
	}()
	sm, err := measure(ctx, rate, warm, dur, s.cpu, rec, func(ctx context.Context, _ int, p []byte) error {
		return s.publish(ctx, channel, p)
	})
	_ = ws.Close()
	<-readDone
	return sm, err
}

// publish posts p to the node's publish endpoint.
func (s *centrifugeSys) publish(ctx context.Context, channel string, p []byte) error {
	return s.post(ctx, "/publish?channel="+channel, "publishing", p)
}

// childCentrifuge runs the node: /connection/websocket for clients (every
// connection accepted as user "peers", every subscription allowed),
// /connection/sse (the SSE transport: a connect whose data names a
// {"channel"} gets a server-side subscription to it, no pong expected) and
// POST /publish?channel= whose body is published as is.
func childCentrifuge() error {
	node, err := centrifuge.New(centrifuge.Config{})
	if err != nil {
		return fmt.Errorf("creating the centrifuge node: %w", err)
	}
	node.OnConnecting(func(_ context.Context, e centrifuge.ConnectEvent) (centrifuge.ConnectReply, error) {
		reply := centrifuge.ConnectReply{Credentials: &centrifuge.Credentials{UserID: "peers"}}
		var d struct {
			Channel string `json:"channel"`
		}
		if len(e.Data) > 0 && json.Unmarshal(e.Data, &d) == nil && d.Channel != "" {
			reply.Subscriptions = map[string]centrifuge.SubscribeOptions{d.Channel: {}}
		}
		return reply, nil
	})
	node.OnConnect(func(c *centrifuge.Client) {
		c.OnSubscribe(func(_ centrifuge.SubscribeEvent, cb centrifuge.SubscribeCallback) {
			cb(centrifuge.SubscribeReply{}, nil)
		})
	})
	if err := node.Run(); err != nil {
		return fmt.Errorf("running the centrifuge node: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/connection/websocket", centrifuge.NewWebsocketHandler(node, centrifuge.WebsocketConfig{}))
	mux.Handle("/connection/sse", centrifuge.NewSSEHandler(node, centrifuge.SSEConfig{
		PingPongConfig: centrifuge.PingPongConfig{PongTimeout: -1}}))
	mux.HandleFunc("POST /publish", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if _, err := node.Publish(r.URL.Query().Get("channel"), b); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "{}")
	})
	srv, err := serveChild(mux)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
	return node.Shutdown(ctx)
}
