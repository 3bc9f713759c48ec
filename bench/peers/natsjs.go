package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/heraldmq/herald/internal/benchstat"
)

// natsSys is an embedded nats-server with JetStream (file storage) in a
// child process; pushes are JetStream publishes that wait for the stream's
// ack, one consumer acks each message explicitly.
type natsSys struct {
	label string
	ch    *child
	dir   string
	nc    *nats.Conn
	js    jetstream.JetStream
	n     int
}

func startNATS(ctx context.Context, self string, syncAlways bool) (*natsSys, error) {
	dir, err := os.MkdirTemp("", "herald-peers-nats-")
	if err != nil {
		return nil, fmt.Errorf("creating the JetStream directory: %w", err)
	}
	label := "nats"
	args := []string{"child", "nats", dir}
	if syncAlways {
		label = "nats-sync"
		args = append(args, "sync")
	}
	ch, err := startChild(ctx, self, args...)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(ch.addr)
	if err != nil {
		ch.stop()
		return nil, fmt.Errorf("connecting to nats: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		ch.stop()
		return nil, fmt.Errorf("opening JetStream: %w", err)
	}
	return &natsSys{label: label, ch: ch, dir: dir, nc: nc, js: js}, nil
}

func (s *natsSys) name() string { return s.label }

func (s *natsSys) cpu() (time.Duration, time.Duration) { return procCPU(s.ch.pid()), 0 }

func (s *natsSys) run(ctx context.Context, rate int, warm, dur time.Duration) (sample, error) {
	s.n++
	stream := fmt.Sprintf("PEERS%d_%d", rate, s.n)
	subj := fmt.Sprintf("peers.%d.%d", rate, s.n)
	st, err := s.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subj},
		Storage: jetstream.FileStorage})
	if err != nil {
		return sample{}, fmt.Errorf("creating stream %s: %w", stream, err)
	}
	defer func() { _ = s.js.DeleteStream(context.WithoutCancel(ctx), stream) }()
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy,
		MaxAckPending: 1000})
	if err != nil {
		return sample{}, fmt.Errorf("creating a consumer: %w", err)
	}
	rec := benchstat.NewRecorder(runLength(rate, warm, dur))
	cc, err := cons.Consume(func(m jetstream.Msg) {
		rec.RecordJSON(m.Data(), time.Now())
		_ = m.Ack()
	})
	if err != nil {
		return sample{}, fmt.Errorf("consuming: %w", err)
	}
	defer cc.Stop()
	return measure(ctx, rate, warm, dur, s.cpu, rec, func(ctx context.Context, _ int, p []byte) error {
		_, err := s.js.Publish(ctx, subj, p)
		return err
	})
}

func (s *natsSys) close() {
	s.nc.Close()
	s.ch.stop()
	_ = os.RemoveAll(s.dir)
}

// childNATS runs the embedded server: args are the store directory and,
// optionally, "sync" for sync_interval: always (an fsync per write, the
// durability Herald's synchronous commit gives; the default fsyncs every
// 2 minutes).
func childNATS(args []string) error {
	if len(args) < 1 {
		return fmt.Errorf("child nats: want a store directory")
	}
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: args[0],
		NoSigs: true, NoLog: true}
	if len(args) > 1 && args[1] == "sync" {
		opts.SyncAlways = true
		opts.SyncInterval = 2 * time.Minute // what sync_interval: always sets next to SyncAlways
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("creating nats-server: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		return fmt.Errorf("nats-server not ready in 30 s")
	}
	fmt.Println("ready " + ns.ClientURL())
	waitParent()
	ns.Shutdown()
	ns.WaitForShutdown()
	return nil
}

// waitParent returns when stdin closes (the parent stops the child or
// dies) or on SIGTERM.
func waitParent() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	eof := make(chan struct{})
	go func() {
		b := make([]byte, 64)
		for {
			if _, err := os.Stdin.Read(b); err != nil {
				close(eof)
				return
			}
		}
	}()
	select {
	case <-sig:
	case <-eof:
	}
}

func (s *natsSys) e2eMaxGroups() int { return 1 << 20 }

// e2e publishes each batch with PublishAsync and waits for the stream's
// ack of every message; each group is a durable pull consumer (explicit
// acks, at most 1,000 unacknowledged, as Herald's maxInFlight) on a
// connection of its own.
func (s *natsSys) e2e(ctx context.Context, groups int, warm, dur time.Duration) (e2eSample, error) {
	s.n++
	stream := fmt.Sprintf("PEERSE2E%d_%d", groups, s.n)
	subj := fmt.Sprintf("peers.e2e.%d.%d", groups, s.n)
	if _, err := s.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subj},
		Storage: jetstream.FileStorage}); err != nil {
		return e2eSample{}, fmt.Errorf("creating stream %s: %w", stream, err)
	}
	defer func() { _ = s.js.DeleteStream(context.WithoutCancel(ctx), stream) }()
	r := newE2ERun(groups)
	for i, g := range r.groups {
		nc, err := nats.Connect(s.ch.addr)
		if err != nil {
			return e2eSample{}, fmt.Errorf("connecting to nats: %w", err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return e2eSample{}, fmt.Errorf("opening JetStream: %w", err)
		}
		cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: fmt.Sprintf("g%d", i),
			AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000})
		if err != nil {
			return e2eSample{}, fmt.Errorf("creating consumer g%d: %w", i, err)
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			g.deliverJSON(m.Data())
			_ = m.Ack()
		})
		if err != nil {
			return e2eSample{}, fmt.Errorf("consuming: %w", err)
		}
		defer cc.Stop()
	}
	return measureE2E(ctx, r, warm, dur, s.cpu, func(ctx context.Context, _ int, ps [][]byte) error {
		futs := make([]jetstream.PubAckFuture, len(ps))
		for k, p := range ps {
			f, err := s.js.PublishAsync(subj, p)
			if err != nil {
				return err
			}
			futs[k] = f
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
}
