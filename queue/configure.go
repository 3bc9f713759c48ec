package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options are a queue's settings. The JSON names are the API's.
type Options struct {
	LeaseTime         int `json:"leaseTime"`         // seconds a pop's lease lasts
	RetryLimit        int `json:"retryLimit"`        // failed deliveries retried before the DLQ
	RetryDelay        int `json:"retryDelay"`        // milliseconds; stored for clients, not yet applied
	DelayedProcessing int `json:"delayedProcessing"` // seconds before a pushed message is visible
	WindowBuffer      int `json:"windowBuffer"`      // seconds a partition must be quiet before delivery
	MaxSize           int `json:"maxSize"`
	// TTL: seconds a message lives: one older than it is never delivered
	// (a pop skips it, a replay leaves its dead letter) and retention
	// deletes it, consumed or not (0: never, the default).
	TTL                       int  `json:"ttl"`
	RetentionSeconds          int  `json:"retentionSeconds"`
	CompletedRetentionSeconds int  `json:"completedRetentionSeconds"`
	RetentionEnabled          bool `json:"retentionEnabled"`
	// DeadLetterQueue: a message a consumer group gives up on (failed past
	// RetryLimit, acked dlq, undecryptable, past MaxWaitTimeSeconds) is
	// kept as a dead letter; false: it is dropped (finished for the group,
	// no copy kept). Default true.
	DeadLetterQueue bool `json:"deadLetterQueue"`
	// DLQAfterMaxRetries: with DeadLetterQueue, a message that failed past
	// RetryLimit (nacked, or its lease expired) is dead-lettered; false:
	// it is dropped. Default true.
	DLQAfterMaxRetries bool `json:"dlqAfterMaxRetries"`
	Priority           int  `json:"priority"`
	EncryptionEnabled  bool `json:"encryptionEnabled"`
	MaxWaitTimeSeconds int  `json:"maxWaitTimeSeconds"`
	// IdleGroupRetentionSeconds: a consumer group none of whose consumers
	// has read for this long, holding no lease, is removed with its
	// positions by retention (0: kept forever; under
	// MinIdleGroupRetentionSeconds counts as that). The default group
	// (queue mode) is never removed.
	IdleGroupRetentionSeconds int `json:"idleGroupRetentionSeconds"`
}

// DefaultOptions are the settings of a queue created by a push, and the base
// that configure overlays the given options on (the column defaults of
// queues, migration 0020). They are the reference server's but for three,
// which it answers as ttl 3600, deadLetterQueue and dlqAfterMaxRetries
// false while it never expires a message and always dead-letters: Herald
// honours them, and its defaults are what the reference does (ttl 0,
// dead-lettering on).
func DefaultOptions() Options {
	return Options{LeaseTime: 300, RetryLimit: 3, RetryDelay: 1000, DeadLetterQueue: true, DLQAfterMaxRetries: true,
		IdleGroupRetentionSeconds: IdleGroupRetentionDefault}
}

// Upper bounds of the integer options. Each is far above any sensible
// setting and inside the int4 columns that store it, so an out-of-range
// value is the client's mistake (400), never a database error (500) or a
// silent wrap.
const (
	MaxRetryLimit       = 10000
	MaxRetryDelayMillis = 24 * 60 * 60 * 1000     // one day
	MaxDelaySeconds     = 30 * 24 * 60 * 60       // delayedProcessing: 30 days
	MaxWindowSeconds    = 24 * 60 * 60            // windowBuffer: one day
	MaxQueueSize        = 1000000000              // maxSize, in messages
	MaxKeepSeconds      = 10 * 365 * 24 * 60 * 60 // ttl, retentionSeconds, completedRetentionSeconds, maxWaitTimeSeconds: ten years
	MaxPriority         = 1000000
)

// IdleGroupRetentionDefault is a queue's idleGroupRetentionSeconds unless
// configured: one day. MinIdleGroupRetentionSeconds is the least it
// acts on: a group's last read is recorded at most every GroupSeenEvery,
// so a shorter time could remove a group that is reading.
const (
	IdleGroupRetentionDefault    = 24 * 60 * 60
	MinIdleGroupRetentionSeconds = 3 * int(GroupSeenEvery/time.Second)
)

// OptionRange is the accepted range of an integer option, both ends
// included.
type OptionRange struct {
	Name     string // the API's name
	Min, Max int
	field    func(*Options) *int
}

// OptionRanges are the integer options with their ranges, in the API's
// order. Priority is not negative: syncnet carries it unsigned.
var OptionRanges = []OptionRange{
	{"leaseTime", 1, MaxLeaseSeconds, func(o *Options) *int { return &o.LeaseTime }},
	{"retryLimit", 0, MaxRetryLimit, func(o *Options) *int { return &o.RetryLimit }},
	{"retryDelay", 0, MaxRetryDelayMillis, func(o *Options) *int { return &o.RetryDelay }},
	{"delayedProcessing", 0, MaxDelaySeconds, func(o *Options) *int { return &o.DelayedProcessing }},
	{"windowBuffer", 0, MaxWindowSeconds, func(o *Options) *int { return &o.WindowBuffer }},
	{"maxSize", 0, MaxQueueSize, func(o *Options) *int { return &o.MaxSize }},
	{"ttl", 0, MaxKeepSeconds, func(o *Options) *int { return &o.TTL }},
	{"retentionSeconds", 0, MaxKeepSeconds, func(o *Options) *int { return &o.RetentionSeconds }},
	{"completedRetentionSeconds", 0, MaxKeepSeconds, func(o *Options) *int { return &o.CompletedRetentionSeconds }},
	{"priority", 0, MaxPriority, func(o *Options) *int { return &o.Priority }},
	{"maxWaitTimeSeconds", 0, MaxKeepSeconds, func(o *Options) *int { return &o.MaxWaitTimeSeconds }},
	{"idleGroupRetentionSeconds", 0, MaxKeepSeconds, func(o *Options) *int { return &o.IdleGroupRetentionSeconds }},
}

func (r OptionRange) errorf() error {
	return inputErrorf("options.%s must be an integer between %d and %d", r.Name, r.Min, r.Max)
}

// Validate rejects an integer option out of its range (OptionRanges),
// naming the option and the range.
func (o Options) Validate() error {
	for _, r := range OptionRanges {
		if v := *r.field(&o); v < r.Min || v > r.Max {
			return r.errorf()
		}
	}
	return nil
}

// overlay sets the options named in raw (a JSON object with the API's
// names) on o. An integer option that is not an integer, or does not fit
// an int (2^64), is refused with its range, as Validate refuses one out of
// it, rather than with the decoder's message.
func (o *Options) overlay(raw json.RawMessage) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return inputErrorf("options: %v", err)
	}
	for _, r := range OptionRanges {
		v, ok := fields[r.Name]
		if !ok || string(v) == "null" {
			continue
		}
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return r.errorf()
		}
		if n < int64(r.Min) || n > int64(r.Max) {
			return r.errorf()
		}
	}
	// Only the names as written: encoding/json would read "LEASETIME" as
	// leaseTime, and JSON.parse (the reference) reads it as an unknown
	// name, ignored.
	exact := make(map[string]json.RawMessage, len(fields))
	for name, v := range fields {
		if optionNames[name] {
			exact[name] = v
		}
	}
	b, err := json.Marshal(exact)
	if err != nil {
		return inputErrorf("options: %v", err)
	}
	if err := json.Unmarshal(b, o); err != nil {
		return inputErrorf("options: %v", err)
	}
	return nil
}

// optionNames are Options' JSON names.
var optionNames = func() map[string]bool {
	t := reflect.TypeFor[Options]()
	out := make(map[string]bool, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		out[name] = true
	}
	return out
}()

// ConfigureRequest creates a queue or changes its settings.
type ConfigureRequest struct {
	Queue string
	// Namespace and Task: zero keeps the stored value, or for a new queue
	// derives them from a dotted name ("billing.invoices" → billing, invoices).
	Namespace string
	Task      string
	// Options holds the settings to change as a JSON object with the API's
	// names; nil or {} changes none.
	Options json.RawMessage
	// Replace resets every option left out of Options to its default. By
	// default they keep their stored values (a merge), so configuring one
	// option cannot silently reset the others.
	Replace bool
}

// ConfigureResult is the queue as stored.
type ConfigureResult struct {
	QueueID     string
	PartitionID string // the Default partition
	Queue       string
	Namespace   string
	Task        string
	Options     Options
	Version     int64 // bumped by every configure
}

const optionColumns = `namespace, task, lease_time, retry_limit, retry_delay, delayed_processing, window_buffer,
	max_size, ttl, retention_seconds, completed_retention_seconds, retention_enabled, dead_letter_queue,
	dlq_after_max_retries, priority, encryption_enabled, max_wait_time_seconds, idle_group_retention_seconds`

const configureSQL = `-- herald:configure
INSERT INTO queues (id, name, ` + optionColumns + `)
VALUES ($1::uuid, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)
ON CONFLICT (name) DO UPDATE SET namespace = EXCLUDED.namespace, task = EXCLUDED.task,
	lease_time = EXCLUDED.lease_time, retry_limit = EXCLUDED.retry_limit, retry_delay = EXCLUDED.retry_delay,
	delayed_processing = EXCLUDED.delayed_processing, window_buffer = EXCLUDED.window_buffer,
	max_size = EXCLUDED.max_size, ttl = EXCLUDED.ttl, retention_seconds = EXCLUDED.retention_seconds,
	completed_retention_seconds = EXCLUDED.completed_retention_seconds,
	retention_enabled = EXCLUDED.retention_enabled, dead_letter_queue = EXCLUDED.dead_letter_queue,
	dlq_after_max_retries = EXCLUDED.dlq_after_max_retries, priority = EXCLUDED.priority,
	encryption_enabled = EXCLUDED.encryption_enabled, max_wait_time_seconds = EXCLUDED.max_wait_time_seconds,
	idle_group_retention_seconds = EXCLUDED.idle_group_retention_seconds,
	version = queues.version + 1, updated_at = now()
RETURNING id::text, version`

// Configure creates or updates a queue (an upsert) and makes sure its Default
// partition exists. It reads the stored settings under the row lock, so two
// concurrent merges cannot lose each other's changes.
func (s *Store) Configure(ctx context.Context, req ConfigureRequest) (*ConfigureResult, error) {
	if err := ValidateName("queue", req.Queue); err != nil {
		return nil, err
	}
	if err := errors.Join(validText("namespace", req.Namespace), validText("task", req.Task)); err != nil {
		return nil, inputErrorf("%v", err)
	}
	res := &ConfigureResult{Queue: req.Queue}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		o := DefaultOptions()
		var ns, task string
		err := tx.QueryRow(ctx, `SELECT `+optionColumns+` FROM queues WHERE name = $1 FOR UPDATE`, req.Queue).Scan(
			&ns, &task, &o.LeaseTime, &o.RetryLimit, &o.RetryDelay, &o.DelayedProcessing, &o.WindowBuffer,
			&o.MaxSize, &o.TTL, &o.RetentionSeconds, &o.CompletedRetentionSeconds, &o.RetentionEnabled,
			&o.DeadLetterQueue, &o.DLQAfterMaxRetries, &o.Priority, &o.EncryptionEnabled, &o.MaxWaitTimeSeconds,
			&o.IdleGroupRetentionSeconds)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			o = DefaultOptions()
			ns, task = namespaceTask(req.Queue)
		case err != nil:
			return fmt.Errorf("reading queue %s: %w", req.Queue, err)
		case req.Replace:
			o = DefaultOptions()
		}
		if len(req.Options) > 0 {
			if err := o.overlay(req.Options); err != nil {
				return err
			}
		}
		if err := o.Validate(); err != nil {
			return err
		}
		if o.EncryptionEnabled && s.sealer == nil {
			return inputErrorf("options.encryptionEnabled needs the server's encryption key (--encryption-key)")
		}
		if req.Namespace != "" || req.Task != "" {
			ns, task = req.Namespace, req.Task
		}
		res.Namespace, res.Task, res.Options = ns, task, o
		if err := tx.QueryRow(ctx, configureSQL, NewID(), req.Queue, ns, task, o.LeaseTime, o.RetryLimit,
			o.RetryDelay, o.DelayedProcessing, o.WindowBuffer, o.MaxSize, o.TTL, o.RetentionSeconds,
			o.CompletedRetentionSeconds, o.RetentionEnabled, o.DeadLetterQueue, o.DLQAfterMaxRetries, o.Priority,
			o.EncryptionEnabled, o.MaxWaitTimeSeconds, o.IdleGroupRetentionSeconds).Scan(&res.QueueID, &res.Version); err != nil {
			return fmt.Errorf("configuring queue %s: %w", req.Queue, err)
		}
		// A new partition gets a consumer row per group of its queue, as in
		// resolvePartitions (the queue row's lock, held since the first
		// statement, orders this with a registration).
		if _, err := tx.Exec(ctx, `WITH created AS (
				INSERT INTO partitions (id, queue_id, name) VALUES ($1::uuid, $2::uuid, $3)
				ON CONFLICT (queue_id, name) DO NOTHING
				RETURNING id, queue_id
			)
			`+groupRowsOfCreatedSQL, NewID(), res.QueueID, DefaultPartition); err != nil {
			return fmt.Errorf("creating default partition of %s: %w", req.Queue, err)
		}
		if err := tx.QueryRow(ctx, `SELECT id::text FROM partitions WHERE queue_id = $1::uuid AND name = $2`,
			res.QueueID, DefaultPartition).Scan(&res.PartitionID); err != nil {
			return fmt.Errorf("reading default partition of %s: %w", req.Queue, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.cacheConfig(res.Info())
	return res, nil
}

// Info is the configured queue as the config cache holds it.
func (r *ConfigureResult) Info() QueueInfo {
	return QueueInfo{ID: r.QueueID, Name: r.Queue, Namespace: r.Namespace, Task: r.Task, Options: r.Options,
		Version: r.Version}
}

// DeleteQueue removes a queue with its partitions, messages, consumer state
// and dead letters. It reports whether the queue existed.
//
// It locks the queue's partitions first, as a push does: a push in flight
// finishes before the delete, and a push that comes after finds the
// partition gone and recreates the queue.
func (s *Store) DeleteQueue(ctx context.Context, name string) (bool, error) {
	if err := ValidateName("queue", name); err != nil {
		return false, err
	}
	var existed bool
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`SELECT p.id FROM partitions p JOIN queues q ON q.id = p.queue_id WHERE q.name = $1 ORDER BY p.id FOR UPDATE OF p`, name)
		b.Queue(`DELETE FROM messages WHERE partition_id IN (
			SELECT p.id FROM partitions p JOIN queues q ON q.id = p.queue_id WHERE q.name = $1)`, name)
		b.Queue(`DELETE FROM queues WHERE name = $1`, name)
		br := tx.SendBatch(ctx, b)
		defer func() { _ = br.Close() }()
		if _, err := br.Exec(); err != nil {
			return err
		}
		if _, err := br.Exec(); err != nil {
			return err
		}
		tag, err := br.Exec()
		existed = tag.RowsAffected() > 0
		return err
	})
	s.forgetQueue(name)
	if err != nil {
		return false, fmt.Errorf("deleting queue %s: %w", name, err)
	}
	return existed, nil
}
