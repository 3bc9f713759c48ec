package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldmq/herald/internal/benchstat"
)

// pgFloorSys is the latency scenario's floor for a queue in PostgreSQL:
// the least an at-least-once queue stored in PostgreSQL, with Herald's
// transports (an HTTP push, delivery and acks on a WebSocket), can do
// per message on this machine. A child process (its CPU its own; the
// shared PostgreSQL's processes counted as for Herald) serves:
//
//   - POST /push: Herald's single-item push body; one INSERT of the
//     message row (id bigserial, queue, partition, payload bytea), its own
//     transaction, committed synchronously (fsync and synchronous_commit
//     on, a pgx pool), and the answer, 201, after the commit;
//   - GET /ws/{queue}: the queue's one consumer. After the commit the push
//     hands the message to it in memory, and a writer goroutine writes it
//     to the socket (what waits written together in one frame: id, length,
//     payload); the consumer acks each frame's messages with one frame of
//     their ids, and each ack frame is one DELETE of those rows, its own
//     synchronous commit.
//
// So each message costs two synchronous commits (the INSERT, and its
// share of one DELETE), over the same transports as Herald, and nothing
// of a queue's own work. The statements it sends: one INSERT per message
// and one DELETE per ack frame, each an implicit transaction (no BEGIN or
// COMMIT sent; pgx's prepared statements: Bind, Execute, Sync). It leaves
// out everything a queue needs beyond that: leases and their expiry,
// retries and dead letters, offsets or cursors per partition and consumer
// group, waking consumers across instances (polling, NOTIFY or a
// replication stream), redelivery from the table after a restart or to
// a consumer that joins later (a message pushed with no consumer stays in
// the table, handed to nobody), flow control (maxInFlight), several
// consumers or groups, authentication, validation beyond the body's
// shape, and metrics. Herald's figures cannot go below it on the same
// PostgreSQL; the distance to it is what the queue adds.
//
// pg-floor-async-ack (only when asked for) is the same floor with its
// DELETEs committed without waiting for their WAL flush (a pool of its own
// with synchronous_commit off): at least once allows it, since an ack a
// crash loses only brings its message again, and so it is the least such a
// queue can do with one synchronous commit per message. Herald commits its
// acks synchronously (queue/ack.go), as pg-floor does.
//
// Order: a push hands its message over after its commit returns and
// before it answers, so a push answered before another is sent is
// delivered before it, in every partition (the order a producer can
// see); two pushes under way together are handed over in the order their
// commits came back. No lock is held across a commit, so pushes to one
// partition commit together as pushes to many do.
type pgFloorSys struct {
	childSys
	pg         *postgres
	partitions int
	asyncAck   bool // pg-floor-async-ack
}

// pgFloorConns is the floor's pool size: one connection per producer of
// the benchmark's pool, so that no push waits for a connection and
// concurrent commits share PostgreSQL's WAL flushes. All are opened at
// the start and kept: a backend that exits takes its CPU time with it.
const pgFloorConns = 16

// pgFloorMaxAck is the most ids one ack frame may carry.
const pgFloorMaxAck = 10000

// startPGFloor starts the floor's server on the database pgfloor (with
// asyncAck, pg-floor-async-ack's on pgfloorasync).
func startPGFloor(ctx context.Context, self string, pg *postgres, partitions int, asyncAck bool) (*pgFloorSys, error) {
	args := []string{"pg-floor", pg.url("pgfloor")}
	if asyncAck {
		args = []string{"pg-floor", pg.url("pgfloorasync"), "async-ack"}
	}
	cs, err := startChildSys(ctx, self, args...)
	if err != nil {
		return nil, err
	}
	return &pgFloorSys{childSys: cs, pg: pg, partitions: partitions, asyncAck: asyncAck}, nil
}

func (s *pgFloorSys) name() string {
	if s.asyncAck {
		return "pg-floor-async-ack"
	}
	return "pg-floor"
}

func (s *pgFloorSys) cpu() (time.Duration, time.Duration) { return procCPU(s.ch.pid()), s.pg.cpu() }

func (s *pgFloorSys) run(ctx context.Context, rate int, warm, dur time.Duration) (sample, error) {
	s.n++
	q := fmt.Sprintf("peers-%d-%d", rate, s.n)
	base := "http://" + s.ch.addr
	rec := benchstat.NewRecorder(runLength(rate, warm, dur))
	ws, err := dialPGFloor(ctx, base, q)
	if err != nil {
		return sample{}, err
	}
	done := make(chan error, 1)
	go func() {
		done <- consumePGFloor(ws, func(_ int64, p []byte) { rec.RecordJSON(p, time.Now()) })
	}()
	st0, _ := s.stats(ctx)
	sm, err := measure(ctx, rate, warm, dur, s.cpu, rec, func(ctx context.Context, i int, p []byte) error {
		return pushPGFloor(ctx, s.http, base, q, fmt.Sprintf("p%d", i%s.partitions), p)
	})
	if st1, serr := s.stats(ctx); serr == nil && st1.Pushes > st0.Pushes {
		// On the log's line of the run: the statements it sent per message.
		d := pgFloorStats{st1.Pushes - st0.Pushes, st1.Frames - st0.Frames, st1.AckFrames - st0.AckFrames,
			st1.Acked - st0.Acked}
		fmt.Fprintf(os.Stderr, "(%d INSERTs, %d frames written, %d ack frames = DELETEs for %d acks: %.2f statements "+
			"per message) ", d.Pushes, d.Frames, d.AckFrames, d.Acked, float64(d.Pushes+d.AckFrames)/float64(d.Pushes))
	}
	select {
	case cerr := <-done: // it failed before the end
		if err == nil {
			err = fmt.Errorf("consuming: %w", cerr)
		}
	default:
		_ = ws.Close()
		<-done
	}
	return sm, err
}

// stats reads the server's counters.
func (s *pgFloorSys) stats(ctx context.Context) (pgFloorStats, error) {
	var st pgFloorStats
	b, err := call(ctx, s.http, http.MethodGet, "http://"+s.ch.addr+"/stats", nil, http.StatusOK, "reading the counters")
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("decoding the counters: %w", err)
	}
	return st, nil
}

// pgFloorStats counts what the floor's server did since it started.
type pgFloorStats struct {
	Pushes    int64 `json:"pushes"`    // messages stored: INSERTs
	Frames    int64 `json:"frames"`    // frames written to consumers
	AckFrames int64 `json:"ackFrames"` // ack frames read: DELETEs
	Acked     int64 `json:"acked"`     // ids in them
}

// pushPGFloor pushes payload p to partition part of queue q on the floor
// at base (http://host:port), Herald's single-item push body.
func pushPGFloor(ctx context.Context, c *http.Client, base, q, part string, p []byte) error {
	body := fmt.Sprintf(`{"items":[{"queue":%q,"partition":%q,"payload":%s}]}`, q, part, p)
	_, err := call(ctx, c, http.MethodPost, base+"/push", []byte(body), http.StatusCreated, "pushing")
	return err
}

// dialPGFloor opens queue q's consumer socket on the floor at base
// (http://host:port). The server takes the messages pushed from the
// moment it answers.
func dialPGFloor(ctx context.Context, base, q string) (*websocket.Conn, error) {
	ws, res, err := websocket.DefaultDialer.DialContext(ctx, "ws"+strings.TrimPrefix(base, "http")+"/ws/"+q, nil)
	if res != nil && res.Body != nil {
		_ = res.Body.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("dialing the floor's socket: %w", err)
	}
	return ws, nil
}

// consumePGFloor reads ws's frames until it fails or closes, gives got
// each message in turn (its id and payload) and acks each frame's
// messages with one frame of their ids (the messages that arrived
// together acked together, as Herald's SDK joins its acks).
func consumePGFloor(ws *websocket.Conn, got func(id int64, p []byte)) error {
	for {
		_, b, err := ws.ReadMessage()
		if err != nil {
			return fmt.Errorf("reading a frame: %w", err)
		}
		var ack []byte
		for len(b) > 0 {
			if len(b) < 12 || len(b) < 12+int(binary.BigEndian.Uint32(b[8:])) {
				return errors.New("reading a frame: a message is cut short")
			}
			id, n := binary.BigEndian.Uint64(b), int(binary.BigEndian.Uint32(b[8:]))
			got(int64(id), b[12:12+n]) // #nosec G115 -- a bigserial
			ack = binary.BigEndian.AppendUint64(ack, id)
			b = b[12+n:]
		}
		if err := ws.WriteMessage(websocket.BinaryMessage, ack); err != nil {
			return fmt.Errorf("acking: %w", err)
		}
	}
}

// pgFloorServer is the floor's server side (childPGFloor serves it).
type pgFloorServer struct {
	pool *pgxpool.Pool
	// ackPool runs the DELETEs: pool, or with asyncAck a pool of its own
	// whose commits do not wait for their WAL flush.
	ackPool *pgxpool.Pool
	mu      sync.Mutex
	subs    map[string]*pgFloorSub // each queue's one consumer
	acks    sync.WaitGroup         // DELETEs under way
	// pushes, frames, ackFrames, acked: pgFloorStats.
	pushes, frames, ackFrames, acked atomic.Int64
}

// pgFloorSub is a consumer: the messages handed to it, not yet written
// (each id, length, payload), and a wake-up for its writer.
type pgFloorSub struct {
	mu      sync.Mutex
	pending []byte
	wake    chan struct{}
}

// newPGFloorServer connects a pool of conns connections to dsn (all
// opened now, synchronous_commit on) and creates the messages table if it
// is not there. With
// asyncAck the DELETEs run on another pool of conns connections, with
// synchronous_commit off.
func newPGFloorServer(ctx context.Context, dsn string, conns int32, asyncAck bool) (*pgFloorServer, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing the database URL: %w", err)
	}
	cfg.MaxConns, cfg.MinConns = conns, conns
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on" // whatever the cluster's default
	cfg.MaxConnIdleTime, cfg.MaxConnLifetime = time.Hour, 24*time.Hour
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS messages (id bigserial PRIMARY KEY,
		queue text NOT NULL, partition text NOT NULL, payload bytea NOT NULL)`); err != nil {
		pool.Close()
		return nil, fmt.Errorf("creating the messages table: %w", err)
	}
	s := &pgFloorServer{pool: pool, ackPool: pool, subs: map[string]*pgFloorSub{}}
	if asyncAck {
		acfg := cfg.Copy()
		acfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		if s.ackPool, err = pgxpool.NewWithConfig(ctx, acfg); err != nil {
			pool.Close()
			return nil, fmt.Errorf("connecting the ack pool: %w", err)
		}
	}
	return s, nil
}

func (s *pgFloorServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /push", s.push)
	mux.HandleFunc("GET /ws/{queue}", s.subscribe)
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(pgFloorStats{s.pushes.Load(), s.frames.Load(), s.ackFrames.Load(), s.acked.Load()})
	})
	return mux
}

// close waits for the DELETEs under way and closes the pool.
func (s *pgFloorServer) close() {
	s.acks.Wait()
	if s.ackPool != s.pool {
		s.ackPool.Close()
	}
	s.pool.Close()
}

// push stores one message (one INSERT, its own synchronous commit), hands
// it to the queue's consumer and answers 201 with its id.
func (s *pgFloorServer) push(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Items []struct {
			Queue     string          `json:"queue"`
			Partition string          `json:"partition"`
			Payload   json.RawMessage `json:"payload"`
		} `json:"items"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil {
		http.Error(w, "decoding the push: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(body.Items) != 1 || body.Items[0].Queue == "" || len(body.Items[0].Payload) == 0 {
		http.Error(w, "a push is one item with a queue and a payload", http.StatusBadRequest)
		return
	}
	it := body.Items[0]
	var id int64
	if err := s.pool.QueryRow(r.Context(), `INSERT INTO messages (queue, partition, payload) VALUES ($1, $2, $3)
		RETURNING id`, it.Queue, it.Partition, []byte(it.Payload)).Scan(&id); err != nil {
		http.Error(w, "storing the message: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	s.pushes.Add(1)
	s.hand(it.Queue, id, it.Payload)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":%d}`, id)
}

// hand gives a stored message to its queue's consumer, if there is one.
func (s *pgFloorServer) hand(q string, id int64, p []byte) {
	s.mu.Lock()
	c := s.subs[q]
	s.mu.Unlock()
	if c == nil {
		return // the row waits in the table; nobody here delivers it
	}
	c.mu.Lock()
	c.pending = binary.BigEndian.AppendUint64(c.pending, uint64(id))     // #nosec G115 -- a bigserial
	c.pending = binary.BigEndian.AppendUint32(c.pending, uint32(len(p))) // #nosec G115 -- at most 1 MiB
	c.pending = append(c.pending, p...)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

var pgFloorUpgrader = websocket.Upgrader{ReadBufferSize: 4096, WriteBufferSize: 16384}

// subscribe makes the socket the queue's consumer (409 when it has one)
// and writes it what is handed over until either side closes it.
func (s *pgFloorServer) subscribe(w http.ResponseWriter, r *http.Request) {
	q := r.PathValue("queue")
	c := &pgFloorSub{wake: make(chan struct{}, 1)}
	s.mu.Lock()
	if s.subs[q] != nil {
		s.mu.Unlock()
		http.Error(w, "the queue has a consumer", http.StatusConflict)
		return
	}
	s.subs[q] = c // before the upgrade's answer: a push after it is handed over
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.subs, q)
		s.mu.Unlock()
	}()
	ws, err := pgFloorUpgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(8 * pgFloorMaxAck)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.readAcks(ws)
	}()
	defer func() {
		_ = ws.Close()
		<-done
	}()
	for {
		select {
		case <-done:
			return
		case <-c.wake:
		}
		c.mu.Lock()
		buf := c.pending
		c.pending = nil
		c.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		_ = ws.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if err := ws.WriteMessage(websocket.BinaryMessage, buf); err != nil {
			return
		}
		s.frames.Add(1)
	}
}

// readAcks deletes the rows of each ack frame (8-byte ids), one DELETE
// per frame, its own synchronous commit; the frames' DELETEs run
// concurrently. A frame of anything else closes the socket with 1003.
func (s *pgFloorServer) readAcks(ws *websocket.Conn) {
	for {
		t, b, err := ws.ReadMessage()
		if err != nil {
			return
		}
		if t != websocket.BinaryMessage || len(b) == 0 || len(b)%8 != 0 {
			_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseUnsupportedData,
				"an ack frame is one or more 8-byte message ids"), time.Now().Add(time.Second))
			return
		}
		ids := make([]int64, len(b)/8)
		for i := range ids {
			ids[i] = int64(binary.BigEndian.Uint64(b[8*i:])) // #nosec G115 -- a bigserial
		}
		s.ackFrames.Add(1)
		s.acked.Add(int64(len(ids)))
		s.acks.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := s.ackPool.Exec(ctx, `DELETE FROM messages WHERE id = ANY($1)`, ids); err != nil {
				fmt.Fprintln(os.Stderr, "pg-floor: deleting acked rows:", err)
			}
		})
	}
}

// childPGFloor runs the floor's server on the database at args[0];
// "async-ack" after it commits the acks' DELETEs asynchronously.
func childPGFloor(args []string) error {
	if len(args) < 1 || len(args) > 2 || (len(args) == 2 && args[1] != "async-ack") {
		return errors.New("child pg-floor: want a database URL and optionally async-ack")
	}
	s, err := newPGFloorServer(context.Background(), args[0], pgFloorConns, len(args) == 2)
	if err != nil {
		return err
	}
	defer s.close()
	srv, err := serveChild(s.handler())
	if err != nil {
		return err
	}
	_ = srv.Close()
	return nil
}
