package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
)

// DefaultGroup is the consumer group of plain queue mode (competing consumers).
const DefaultGroup = "__QUEUE_MODE__"

// DefaultPartition is the partition a push without one goes to.
const DefaultPartition = "Default"

// PartitionCacheSizeDefault bounds the (queue, partition) → id cache. Each entry
// is ~150 bytes, so the default costs about 1.5 MB at most.
const PartitionCacheSizeDefault = 10000

// PartitionCacheTTL is how long a cached partition id is trusted: a
// partition deleted elsewhere whose notice was lost is looked up again by
// then (a push with a stale id also fails its foreign key and retries once).
const PartitionCacheTTL = 5 * time.Minute

// Config configures a Store.
type Config struct {
	// Pool is the connection pool. Required. Its connections' search_path
	// decides which schema holds the tables.
	Pool *pgxpool.Pool
	// InstanceID is recorded as the owner of leases this instance takes
	// for its streams; leases popped by clients through it are recorded as
	// InstanceID + "#pop" (Store.leaseOwner). Zero means "herald"; it must
	// not end in "#pop".
	InstanceID string
	// PartitionCacheSize bounds the partition id cache; zero means
	// PartitionCacheSizeDefault.
	PartitionCacheSize int
	// PushFlushers is how many push transactions run at once; requests that
	// arrive meanwhile are merged into the next one. Zero means
	// PushFlushersDefault.
	PushFlushers int
	// AckFlushers is how many Ack transactions run at once; requests that
	// arrive meanwhile are merged into the next one where that keeps each
	// request's results (see Store.Ack). Zero means AckFlushersDefault.
	AckFlushers int
	// PartitionCleanupAfter: retention deletes partitions with no messages,
	// no dead letters and no activity for this long. Zero means
	// PartitionCleanupDefault; negative disables it.
	PartitionCleanupAfter time.Duration
	// OnPartitionDeleted, when set, is told of each partition retention
	// deleted (syncnet's PARTITION_DELETED to the peers).
	OnPartitionDeleted func(queue, partition string)
	// TraceRetention: the hygiene loop deletes traces recorded longer ago
	// than this (PruneTraces). Zero means TraceRetentionDefault; negative
	// keeps them forever.
	TraceRetention time.Duration
	// EncryptionKey (32 bytes) encrypts the payloads of queues configured
	// with encryptionEnabled (AES-256-GCM); nil: no key, and configuring
	// such a queue is refused.
	EncryptionKey []byte
	// Configs caches queue settings; nil means a cache of the store's own
	// (a ConfigSnapshot of ConfigCacheSize entries). Pass one to share it,
	// or to read its stats.
	// Pushes to new partitions of a cached queue skip creating the queue.
	Configs ConfigCache
	// OnGivenUp, when set, is told of each pop that gave messages up or
	// skipped them (PopResult's DeadLettered, Dropped, Expired), once,
	// whichever path popped: a client's pop, or the poller's for a
	// long-poll, a WebSocket or an SSE stream. Pop tells it of what it
	// dead-lettered, dropped or skipped; PopAssigned and PopClaim of the
	// undecryptable messages they dead-lettered (only these: they leave
	// the rest to Pop). It runs on the popping goroutine after the
	// commit, with no lock held, and must not block. Nil: nobody is told.
	OnGivenUp func(*PopResult)
	// Logger; the zero value logs nothing.
	Logger zerolog.Logger
}

// PartitionCleanupDefault is how long an empty, idle partition is kept.
const PartitionCleanupDefault = 7 * 24 * time.Hour

// PushFlushersDefault: two pushes in flight keep the database busy while
// the next merged batch gathers; see BenchmarkPushParallel.
const PushFlushersDefault = 2

// AckFlushersDefault: as for pushes; see BenchmarkAckParallel.
const AckFlushersDefault = 2

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.InstanceID == "" {
		c.InstanceID = "herald"
	}
	if c.PartitionCacheSize == 0 {
		c.PartitionCacheSize = PartitionCacheSizeDefault
	}
	if c.PushFlushers == 0 {
		c.PushFlushers = PushFlushersDefault
	}
	if c.AckFlushers == 0 {
		c.AckFlushers = AckFlushersDefault
	}
	if c.PartitionCleanupAfter == 0 {
		c.PartitionCleanupAfter = PartitionCleanupDefault
	}
	if c.TraceRetention == 0 {
		c.TraceRetention = TraceRetentionDefault
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if c.Pool == nil {
		return errors.New("queue: Config.Pool is required")
	}
	if c.PartitionCacheSize < 0 {
		return errors.New("queue: Config.PartitionCacheSize must not be negative")
	}
	if c.PushFlushers < 0 {
		return errors.New("queue: Config.PushFlushers must not be negative")
	}
	if c.AckFlushers < 0 {
		return errors.New("queue: Config.AckFlushers must not be negative")
	}
	if strings.HasSuffix(c.InstanceID, popOwnerSuffix) {
		return fmt.Errorf("queue: Config.InstanceID must not end in %q (the owner of the leases clients pop)", popOwnerSuffix)
	}
	return nil
}

// Store runs every queue operation against PostgreSQL. It is safe for
// concurrent use; all state lives in the database except advisory caches:
// queue settings (configs) and partitions (parts, partitionNames), which
// are dropped on delete and re-checked on use.
type Store struct {
	pool    *pgxpool.Pool
	cfg     Config
	log     zerolog.Logger
	parts   *partCache
	configs ConfigCache
	sealer  *sealer // nil: no encryption key
	pushes  *coalescer[pushReq, []PushResult]
	acks    *coalescer[ackReq, []AckResult]
	handOff atomic.Pointer[HandOff]
	// The one cache of partitions, in two directions, filled together
	// (notePartition): parts maps (queue, name) → ids, for pushes and the
	// poller's hinted pops; partitionNames maps id → (queue, name), for
	// rights checks (PartitionNames) and the logical stream (PartitionOf).
	// An id never changes its names, so the reverse index needs no expiry.
	partitionNames *lru.Cache[string, PartitionName]

	partHits, partMisses, partEvictions atomic.Uint64
	lastAnalyze                         atomic.Int64 // UnixNano of the last analyzeIfDue check
	groupSeen                           groupSeen    // when this instance last wrote each group's last read
	// lastBacklog is the backlog part of the latest hygiene sample, for
	// LatestBacklog; backlogFirst serialises the one read taken before
	// the hygiene loop's first sample (hygiene_backlog.go).
	lastBacklog  atomic.Pointer[BacklogSample]
	backlogFirst sync.Mutex
}

// partitionNamesCacheSize bounds the partition names kept for rights
// checks (about 150 bytes each).
const partitionNamesCacheSize = 100_000

// PartitionCacheStats reports the partition id cache's counters.
func (s *Store) PartitionCacheStats() CacheStats {
	st := CacheStats{Entries: s.parts.Len(), Max: s.cfg.PartitionCacheSize, Hits: s.partHits.Load(),
		Misses: s.partMisses.Load(), Evictions: s.partEvictions.Load()}
	st.HitRate = HitRate(st.Hits, st.Misses)
	return st
}

type partKey struct{ queue, partition string }

type partRef struct {
	queueID, partitionID string
}

// New returns a Store. It does not touch the database; call Migrate first.
func New(cfg Config) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cache := newPartCache(cfg.PartitionCacheSize, PartitionCacheTTL)
	s := &Store{pool: cfg.Pool, cfg: cfg, log: cfg.Logger.With().Str("component", "queue").Logger(), parts: cache,
		configs: cfg.Configs}
	s.partitionNames, _ = lru.New[string, PartitionName](partitionNamesCacheSize) // size is positive: no error
	if s.configs == nil {
		s.configs = NewConfigCache()
	}
	if cfg.EncryptionKey != nil {
		sl, err := newSealer(cfg.EncryptionKey)
		if err != nil {
			return nil, err
		}
		s.sealer = sl
	}
	s.pushes = newPushCoalescer(cfg.PushFlushers, s.pushNow)
	s.acks = newAckCoalescer(cfg.AckFlushers, s.ackNow)
	return s, nil
}

// Pool returns the store's connection pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// querier is what both *pgxpool.Pool and pgx.Tx offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// InputError is a client mistake (bad name, wrong type). Callers answer it
// with 400; it is never worth a retry.
type InputError struct{ Msg string }

func (e *InputError) Error() string { return e.Msg }

func inputErrorf(format string, args ...any) error {
	return &InputError{Msg: fmt.Sprintf(format, args...)}
}

// ErrForeign refuses a call that names another subject's lease (see
// Ack.Holder); nothing was changed. Callers answer it with 403.
var ErrForeign = errors.New("forbidden: a lease it names is held by another subject")

// IsInputError reports whether err is a client's mistake: an InputError, or
// a Postgres data exception (SQLSTATE class 22: a payload number out of
// range, a \u0000 escape jsonb refuses), which only a value the client sent
// can cause once names and ids are validated.
func IsInputError(err error) bool {
	var ie *InputError
	if errors.As(err, &ie) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22")
}

// optTime is t as a statement's parameter: nil (SQL NULL: no bound) for
// the zero time, as the browse, dead-letter and trace filters take From
// and To.
func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// validText rejects text Postgres cannot store (a NUL byte).
func validText(kind, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return inputErrorf("%s must not contain NUL bytes", kind)
	}
	return nil
}

// MaxNameLength bounds queue, partition and consumer group names.
const MaxNameLength = 255

// ValidateName checks a queue, partition or group name: non-empty, at most
// MaxNameLength bytes, no control characters.
func ValidateName(kind, name string) error {
	if name == "" {
		return inputErrorf("%s must not be empty", kind)
	}
	if len(name) > MaxNameLength {
		return inputErrorf("%s must be at most %d bytes", kind, MaxNameLength)
	}
	if !utf8.ValidString(name) {
		return inputErrorf("%s must be UTF-8", kind)
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return inputErrorf("%s must not contain control characters", kind)
		}
	}
	return nil
}

// namespaceTask derives a queue's namespace and task from a dotted name
// ("billing.invoices.eu" → "billing", "invoices"), used when a queue is created
// by a push rather than by configure.
func namespaceTask(name string) (string, string) {
	ns, rest, ok := strings.Cut(name, ".")
	if !ok || ns == "" {
		return "", ""
	}
	task, _, _ := strings.Cut(rest, ".")
	return ns, task
}

// resolvePartitions returns the ids of the given (queue, partition) pairs,
// creating queues and partitions that do not exist yet.
func (s *Store) resolvePartitions(ctx context.Context, keys []partKey) (map[partKey]partRef, error) {
	out := make(map[partKey]partRef, len(keys))
	var missQ, missP []string
	seen := map[partKey]bool{}
	for _, k := range keys {
		if ref, ok := s.parts.Get(k); ok { // an entry older than PartitionCacheTTL is gone
			s.partHits.Add(1)
			out[k] = ref
			continue
		}
		s.partMisses.Add(1)
		if !seen[k] {
			seen[k] = true
			missQ = append(missQ, k.queue)
			missP = append(missP, k.partition)
		}
	}
	if len(missQ) == 0 {
		return out, nil
	}
	if err := s.createPartitions(ctx, missQ, missP, out); err != nil {
		return nil, err
	}
	for _, k := range keys {
		if _, ok := out[k]; !ok {
			// Deleted between insert and select by a concurrent delete.
			return nil, fmt.Errorf("resolving partition %s/%s: %w", k.queue, k.partition, errRaced)
		}
	}
	// Many new partitions at once (a burst of new mailboxes) can leave the
	// cached plans behind the table's size.
	s.analyzeIfDue(ctx)
	return out, nil
}

// createPartitions finds or creates the partitions (queues[i],
// partitions[i]) and their queues, in one batch, into out (and the caches).
func (s *Store) createPartitions(ctx context.Context, queues, partitions []string, out map[partKey]partRef) error {
	b, known := s.createPartitionsBatch(queues, partitions)
	br := s.pool.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	if !known {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("creating queues: %w", err)
		}
	}
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("locking queues: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("creating partitions: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("resolving partitions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k partKey
		var ref partRef
		var info QueueInfo
		if err := scanQueueInfo(prefixScan{rows, []any{&k.partition, &ref.partitionID}}, &info); err != nil {
			return fmt.Errorf("resolving partitions: %w", err)
		}
		k.queue, ref.queueID = info.Name, info.ID
		out[k] = ref
		s.notePartition(k, ref)
		s.cacheConfig(info)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("resolving partitions: %w", err)
	}
	return nil
}

// createPartitionsBatch is createPartitions' batch; known reports that
// every queue is cached (it exists: no create statement).
func (s *Store) createPartitionsBatch(missQ, missP []string) (b *pgx.Batch, known bool) {
	// Queues known to exist (cached config) need no create statement; a
	// cached queue deleted meanwhile yields no row and the push retries.
	b = &pgx.Batch{}
	known = true
	for _, q := range missQ {
		if _, ok := s.CachedConfig(q); !ok {
			known = false
			break
		}
	}
	if !known {
		qids := make([]string, len(missQ))
		nss := make([]string, len(missQ))
		tasks := make([]string, len(missQ))
		for i := range missQ {
			qids[i] = NewID()
			nss[i], tasks[i] = namespaceTask(missQ[i])
		}
		b.Queue(`-- herald:create_queues
		INSERT INTO queues (id, name, namespace, task)
		SELECT DISTINCT ON (t.name) t.id::uuid, t.name, t.ns, t.task
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS t(id, name, ns, task)
		ORDER BY t.name
		ON CONFLICT (name) DO NOTHING`, qids, missQ, nss, tasks)
	}
	pids := make([]string, len(missQ))
	for i := range missQ {
		pids[i] = NewID()
	}
	// Each statement takes its own snapshot, so the final SELECT sees rows
	// that a concurrent creator committed meanwhile. It also returns the
	// queue's settings, which fill the config cache for free.
	//
	// A new partition gets a consumer row per group of its queue. The
	// queue's share lock, taken before, orders this with a group's
	// registration (registerGroupSQL): either the registration sees the
	// partition, or the insert's later snapshot sees the group.
	b.Queue(`-- herald:lock_queues
		SELECT q.id FROM queues q WHERE q.name = ANY($1::text[]) ORDER BY q.id FOR SHARE`, missQ)
	b.Queue(`-- herald:create_partitions
		WITH created AS (
			INSERT INTO partitions (id, queue_id, name)
			SELECT t.id::uuid, q.id, t.partition
			FROM unnest($1::text[], $2::text[], $3::text[]) AS t(id, queue, partition)
			JOIN queues q ON q.name = t.queue
			ORDER BY q.id, t.partition
			ON CONFLICT (queue_id, name) DO NOTHING
			RETURNING id, queue_id
		)
		`+groupRowsOfCreatedSQL, pids, missQ, missP)
	b.Queue(`-- herald:resolve_partitions
		SELECT t.partition, p.id::text, `+queueInfoColumns+`
		FROM unnest($1::text[], $2::text[]) AS t(queue, partition)
		JOIN queues q ON q.name = t.queue
		JOIN partitions p ON p.queue_id = q.id AND p.name = t.partition`, missQ, missP)
	return b, known
}

// groupRowsOfCreatedSQL ends a statement whose CTE created(id, queue_id)
// holds the partitions it created: each gets a consumer row per group
// registered on its queue. Every place that creates partitions uses it.
const groupRowsOfCreatedSQL = `INSERT INTO consumers (partition_id, consumer_group, queue_id)
SELECT c.id, g.name, c.queue_id FROM created c JOIN consumer_groups g ON g.queue_id = c.queue_id
ORDER BY c.id, g.name`

// prefixScan scans leading columns into prefix, then the rest into the
// destinations passed to Scan.
type prefixScan struct {
	rows   pgx.Rows
	prefix []any
}

func (p prefixScan) Scan(dest ...any) error { return p.rows.Scan(append(p.prefix, dest...)...) }

// errRaced marks a conflict with a concurrent delete; the caller retries once.
var errRaced = errors.New("queue deleted concurrently")

// ForgetQueue drops what is cached of a queue (settings, partition ids):
// another instance deleted it (syncnet's QUEUE_CONFIG_DELETE).
func (s *Store) ForgetQueue(name string) { s.forgetQueue(name) }

// ForgetPartition drops one cached partition id: the partition was deleted
// (syncnet's PARTITION_DELETED).
func (s *Store) ForgetPartition(queue, partition string) {
	s.parts.Remove(partKey{queue, partition})
}

// forgetQueue drops what is cached of a queue, its settings and partition
// ids (after delete, or when a cached id turned out to be stale).
func (s *Store) forgetQueue(name string) {
	s.configs.Delete(name)
	s.forgetPartitions(name)
}

// forgetPartitions drops the cached partition ids of a queue.
func (s *Store) forgetPartitions(name string) {
	for _, k := range s.parts.Keys() {
		if k.queue == name {
			s.parts.Remove(k)
		}
	}
}

// isForeignKeyViolation reports whether err is a foreign key violation: a
// cached partition id whose partition was deleted.
func isForeignKeyViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23503"
}
