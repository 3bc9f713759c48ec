package pgnotify

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// SourceLogical labels wake-ups from logical replication.
const SourceLogical = "logical"

// StatusIntervalDefault is how often the replication stream reports its
// position (the server drops a silent walsender after wal_sender_timeout,
// 60 s by default).
const StatusIntervalDefault = 10 * time.Second

// LogicalConfig configures a Logical wake source.
type LogicalConfig struct {
	// Pool is the instance's pool: the replication connection is opened
	// with its settings (so on its schema), and Check reads the server's
	// wal_level through it. Required.
	Pool *pgxpool.Pool
	// URL, when set, is where the replication connection goes instead of
	// the pool's server: a direct URL when the pool goes through a
	// transaction-mode pooler (PgBouncer), which cannot replicate.
	// Empty: the pool's settings.
	URL string
	// Tables is what the stream needs of Herald's tables (queue.Store
	// provides it). Required.
	Tables Tables
	// Waker receives the wake-ups. Required.
	Waker Waker
	// StatusInterval: see StatusIntervalDefault; zero means the default.
	StatusInterval time.Duration
	// BackoffMin and BackoffMax bound the reconnect back-off; zero means
	// BackoffMinDefault and BackoffMaxDefault.
	BackoffMin, BackoffMax time.Duration
	// Registerer receives the metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Logger; the zero value logs nothing.
	Logger zerolog.Logger
}

// Tables is the part of the queue store a Logical asks: pgnotify writes no
// SQL on Herald's tables (they belong to the queue package).
type Tables interface {
	// MessagePublication creates, if missing, the publication of the
	// inserts into the messages table of the pool's schema, and returns
	// its name.
	MessagePublication(ctx context.Context) (string, error)
	// PartitionOf returns the queue and name of a partition id. It is asked
	// once per inserted message, on the stream's goroutine: answers
	// should be cached (ids never change their names).
	PartitionOf(ctx context.Context, partitionID string) (queue, partition string, err error)
}

// Logical wakes queues from the write-ahead log: a temporary pgoutput slot
// streams the inserts into the messages table through a publication, so
// every insert, from any producer (HTTP, the push SQL function, plain
// INSERT), wakes its queue, at no cost to the producer's commit. The slot is
// temporary: it disappears with the connection, so a stopped instance leaves
// nothing that holds WAL back.
type Logical struct {
	cfg    LogicalConfig
	log    zerolog.Logger
	slot   string
	ready  chan struct{}
	events prometheus.Counter
	recons prometheus.Counter
}

// NewLogical returns a Logical source; nothing happens until Run.
func NewLogical(cfg LogicalConfig) (*Logical, error) {
	if cfg.Pool == nil || cfg.Waker == nil || cfg.Tables == nil {
		return nil, errors.New("pgnotify: LogicalConfig.Pool, LogicalConfig.Waker and LogicalConfig.Tables are required")
	}
	cfg.StatusInterval = cmp.Or(cfg.StatusInterval, StatusIntervalDefault)
	cfg.BackoffMin, cfg.BackoffMax = backoffOrDefaults(cfg.BackoffMin, cfg.BackoffMax)
	var b [6]byte
	_, _ = rand.Read(b[:])
	l := &Logical{cfg: cfg, log: cfg.Logger.With().Str("component", "logical").Logger(),
		slot: "herald_" + hex.EncodeToString(b[:]), ready: make(chan struct{}),
		events: counter("herald_logical_inserts_total", "Message inserts seen on the replication stream."),
		recons: counter("herald_logical_reconnects_total", "Times the replication stream was re-established after a failure."),
	}
	if err := register(cfg.Registerer, l.events, l.recons); err != nil {
		return nil, err
	}
	return l, nil
}

// Slot is the name of this instance's temporary replication slot.
func (l *Logical) Slot() string { return l.slot }

// Ready is closed once the stream has started for the first time.
func (l *Logical) Ready() <-chan struct{} { return l.ready }

// Check fails with a clear message when the server cannot do logical
// replication. Call it at start, before Run.
func (l *Logical) Check(ctx context.Context) error {
	var level string
	if err := l.cfg.Pool.QueryRow(ctx, `SHOW wal_level`).Scan(&level); err != nil {
		return fmt.Errorf("reading wal_level: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("--wake logical needs wal_level=logical, but the server has wal_level=%s: "+
			"set it in postgresql.conf (it needs a restart) or use --wake notify", level)
	}
	return nil
}

// Run streams until ctx ends, reconnecting with back-off after failures.
func (l *Logical) Run(ctx context.Context) error {
	reconnecting(ctx, l.cfg.BackoffMin, l.cfg.BackoffMax, l.recons, l.log, l.ready, l.session)
	return nil
}

// session opens the stream (calling up), wakes everything and streams
// until the connection fails or ctx ends.
func (l *Logical) session(ctx context.Context, up func()) (started bool, err error) {
	conn, pos, err := l.open(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	up()
	// Inserts while the stream was down are not replayed: look at everything.
	l.cfg.Waker.WakeAll(SourceLogical)
	return true, l.stream(ctx, conn, pos)
}

// open connects for replication, creates the session's temporary slot
// and starts streaming the publication from the slot's start.
func (l *Logical) open(ctx context.Context) (*pgconn.PgConn, pglogrepl.LSN, error) {
	publication, err := l.cfg.Tables.MessagePublication(ctx)
	if err != nil {
		return nil, 0, err
	}
	cfg := l.cfg.Pool.Config().ConnConfig.Config.Copy()
	if l.cfg.URL != "" {
		if cfg, err = pgconn.ParseConfig(l.cfg.URL); err != nil {
			return nil, 0, fmt.Errorf("parsing the replication URL: %w", err)
		}
	}
	cfg.RuntimeParams = map[string]string{"replication": "database", "application_name": "herald-logical"}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgconn.ConnectConfig(cctx, cfg)
	cancel()
	if err != nil {
		return nil, 0, fmt.Errorf("opening the replication connection: %w", err)
	}
	slot, err := pglogrepl.CreateReplicationSlot(ctx, conn, l.slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true, Mode: pglogrepl.LogicalReplication})
	if err == nil {
		var pos pglogrepl.LSN
		if pos, err = pglogrepl.ParseLSN(slot.ConsistentPoint); err != nil {
			err = fmt.Errorf("parsing the slot's start: %w", err)
		} else if err = pglogrepl.StartReplication(ctx, conn, l.slot, pos, pglogrepl.StartReplicationOptions{
			Mode:       pglogrepl.LogicalReplication,
			PluginArgs: []string{"proto_version '1'", "publication_names '" + publication + "'"},
		}); err != nil {
			err = fmt.Errorf("starting replication: %w", err)
		} else {
			l.log.Info().Str("slot", l.slot).Str("publication", publication).Msg("streaming message inserts")
			return conn, pos, nil
		}
	} else {
		err = fmt.Errorf("creating replication slot %s: %w", l.slot, err)
	}
	_ = conn.Close(context.WithoutCancel(ctx))
	return nil, 0, err
}

// stream reads the replication stream until ctx ends (nil) or it fails,
// waking the queues of inserted messages and reporting its position.
func (l *Logical) stream(ctx context.Context, conn *pgconn.PgConn, pos pglogrepl.LSN) error {
	relations := map[uint32]bool{} // relation ids of the messages table
	nextStatus := time.Now().Add(l.cfg.StatusInterval)
	for {
		if time.Now().After(nextStatus) {
			if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos}); err != nil {
				return fmt.Errorf("sending status: %w", err)
			}
			nextStatus = time.Now().Add(l.cfg.StatusInterval)
		}
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("receiving: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			reply, err := l.copyData(ctx, msg.Data, &pos, relations)
			if err != nil {
				return err
			}
			if reply {
				nextStatus = time.Time{} // answer at once
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication error: %s", msg.Message)
		}
	}
}

// copyData applies one message of the stream: a keepalive (reply: the
// server asks for a status now) or WAL data, moving pos past it.
func (l *Logical) copyData(ctx context.Context, data []byte, pos *pglogrepl.LSN, relations map[uint32]bool) (reply bool, err error) {
	if len(data) == 0 {
		return false, nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return false, fmt.Errorf("parsing keepalive: %w", err)
		}
		*pos = max(*pos, ka.ServerWALEnd)
		return ka.ReplyRequested, nil
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return false, fmt.Errorf("parsing WAL data: %w", err)
		}
		l.handle(ctx, xld.WALData, relations)
		*pos = max(*pos, xld.WALStart+pglogrepl.LSN(len(xld.WALData)))
	}
	return false, nil
}

// handle wakes the queue of an inserted message.
func (l *Logical) handle(ctx context.Context, data []byte, relations map[uint32]bool) {
	m, err := pglogrepl.Parse(data)
	if err != nil {
		l.log.Debug().Err(err).Msg("unparsable pgoutput message")
		return
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		relations[m.RelationID] = m.RelationName == "messages"
	case *pglogrepl.InsertMessage:
		if !relations[m.RelationID] || m.Tuple == nil || len(m.Tuple.Columns) == 0 {
			return
		}
		col := m.Tuple.Columns[0] // partition_id, the table's first column
		if col.DataType != 't' {
			return
		}
		l.events.Inc()
		q, p, err := l.cfg.Tables.PartitionOf(ctx, string(col.Data))
		if err != nil {
			l.log.Debug().Err(err).Msg("unknown partition of an inserted message")
			return
		}
		l.cfg.Waker.Wake(SourceLogical, q, p)
	}
}
