package server

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/gateway"
	"github.com/heraldmq/herald/pgnotify"
	"github.com/heraldmq/herald/poller"
	"github.com/heraldmq/herald/queue"
	"github.com/heraldmq/herald/spool"
	"github.com/heraldmq/herald/syncnet"
)

// Wake modes: what wakes this instance's waiting consumers besides its own
// pushes.
const (
	WakeNotify  = "notify"  // NOTIFY between instances (pgnotify.Notifier and Listener)
	WakeLogical = "logical" // every insert, read from the WAL (pgnotify.Logical)
	WakePoll    = "poll"    // the adaptive sweep only (the reference server's way)
	// WakeLocal: this instance's pushes and syncnet only, no database wake
	// source. Not offered by herald serve; tests use it to show that
	// syncnet alone reaches the peers.
	WakeLocal = "local"
)

// Config.DBMaxConns's bounds: the store's chores need DBMinConns
// (queue.MinPoolConns); DBMaxConnsMax is past any server's
// max_connections here.
const (
	DBMinConns    = queue.MinPoolConns
	DBMaxConnsMax = 10000
)

// PartitionCleanupDaysMax bounds Config.PartitionCleanupDays: a century,
// far below where days as a time.Duration would overflow (and wrap to
// minutes).
const PartitionCleanupDaysMax = 36500

// Config is one instance. cmd/herald fills it from flags and environment;
// tests and herald demo fill it directly. Zero values mean the components'
// defaults unless a field says otherwise.
type Config struct {
	// Listener is served, when set; otherwise Addr is listened on.
	Listener net.Listener
	// Addr is the HTTP listen address when Listener is nil.
	Addr string

	// DatabaseURL of PostgreSQL; empty starts a private PostgreSQL under
	// DataDir/postgres (PGPort, 0 picks a free one), restarted if it dies.
	DatabaseURL string
	// ListenDatabaseURL: a separate connection for LISTEN (WakeNotify) or
	// the replication stream (WakeLogical), straight to PostgreSQL when
	// DatabaseURL goes through a transaction-mode pooler; empty takes
	// LISTEN's from the pool and replicates with the pool's settings.
	ListenDatabaseURL string
	DataDir           string
	PGPort            int
	DBMaxConns        int // 0: max(4, CPUs); else 2 to DBMaxConnsMax
	// DBConnectTimeout bounds a database connection attempt (per host of
	// a multi-host URL) when the URL sets no connect_timeout, which wins.
	// Zero means queue.ConnectTimeoutDefault (5 s).
	DBConnectTimeout time.Duration

	// InstanceID names this instance as lease owner; empty: hostname:port.
	InstanceID string
	// Version is shown by /health and the logs.
	Version string

	BodyLimit       int64
	BodyReadTimeout time.Duration
	// ShutdownTimeout is how long past DrainWindow requests in flight may
	// take at shutdown; then every connection still open is closed, so the
	// HTTP side stops within DrainWindow + ShutdownTimeout. Zero means
	// ShutdownTimeoutDefault.
	ShutdownTimeout time.Duration

	Wake             string // one of the Wake* modes; empty means WakeNotify
	NotifyWindow     time.Duration
	PollWorkers      int
	SweepMin         time.Duration
	SweepMax         time.Duration
	PreflightTimeout time.Duration
	PreflightMax     int

	AllowedOrigins []string
	// MaxConnections caps the HTTP connections of every transport together
	// (gateway.Config.MaxConnections); zero means what the open-file limit
	// allows after a reserve for the database and files (limits.go gives
	// the formula), and a larger value is lowered to that.
	MaxConnections    int
	MaxWSConnections  int
	MaxSSEConnections int
	SSEHeartbeat      time.Duration
	SSEResumeGrace    time.Duration
	DrainWindow       time.Duration

	// Tokens: any of AuthSecret (HMAC, ≥ 32 bytes), AuthPublicKey (a PEM
	// file) or AuthJWKSURL turns auth on.
	AuthSecret    string
	AuthPublicKey string
	AuthJWKSURL   string
	AuthIssuer    string
	AuthCookie    string
	AuthAudience  string

	EncryptionKey string // 64 hex characters, or empty
	// RetentionInterval: zero means queue.RetentionIntervalDefault.
	RetentionInterval    time.Duration
	PartitionCleanupDays int
	// TraceRetention: 0 keeps traces forever (see queue.Config).
	TraceRetention time.Duration

	// SyncSecret (64 hex characters) starts syncnet on SyncBind: its
	// peers are the instances the members table lists (mesh.go), found
	// with no list. SyncPeers are optional seeds besides (host:port: the
	// reference server, or where the advertised address is not the one
	// to use); they require the secret. ServerID empty:
	// hostname:sync-port.
	SyncPeers     []string
	SyncBind      string
	SyncSecret    string
	SyncFreshness time.Duration
	ServerID      string
	// SyncAdvertise is the host:port peers send datagrams to, written in
	// the members table; empty means SyncBind when it names a host, else
	// the local address of this instance's database connection with the
	// bound port (set it behind NAT, or to a Kubernetes pod's address).
	SyncAdvertise string
	// Syncnet starts the node even without a secret or peers (tests).
	Syncnet bool
	// MemberBeat is how often this instance writes its members row and
	// reads the others' (zero: MemberBeatDefault, 2 s); MemberDeadAfter
	// how old another's row may be before it counts as gone (zero:
	// MemberDeadAfterDefault, 7 s).
	MemberBeat, MemberDeadAfter time.Duration

	// BufferDir of the push-maintenance buffer; empty means
	// DataDir/buffer, or no buffer when that cannot be created.
	BufferDir      string
	BufferMaxBytes int64

	MetricsMaxQueues   int
	MetricsGroupLabels bool
	MetricsAuth        bool

	// Registry for /metrics; nil: a new one with the Go and process
	// collectors.
	Registry *prometheus.Registry
	Logger   zerolog.Logger

	// Adjust lets tests and benchmarks change a component's settings
	// that Config does not carry, just before the component is built.
	Adjust Adjust
}

// memberBeat is the members beat's period: MemberBeat, or its default.
func (c *Config) memberBeat() time.Duration {
	if c.MemberBeat <= 0 {
		return MemberBeatDefault
	}
	return c.MemberBeat
}

// Adjust holds optional edits of the components' own configs.
type Adjust struct {
	Store    func(*queue.Config)
	Poller   func(*poller.Config)
	Syncnet  func(*syncnet.Config)
	Notifier func(*pgnotify.NotifierConfig)
	Listener func(*pgnotify.ListenerConfig)
	Logical  func(*pgnotify.LogicalConfig)
	Gateway  func(*gateway.Config)
}

// ShutdownTimeoutDefault is the grace past the drain window: a second,
// the margin the drain window is documented with.
const ShutdownTimeoutDefault = time.Second

// hygieneInterval is how often the storage and backlog gauges are sampled
// (three catalog queries and two bounded ones over consumers and
// dead_letters, see queue/hygiene_backlog.go).
const hygieneInterval = 30 * time.Second

// WithDefaults returns a copy of c with the settings only the assembly
// uses defaulted; the components default the rest themselves.
func (c Config) WithDefaults() Config {
	if c.Wake == "" {
		c.Wake = WakeNotify
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = ShutdownTimeoutDefault
	}
	if c.SyncBind == "" {
		c.SyncBind = "127.0.0.1:0"
	}
	return c
}

// Validate reports the first field the assembly cannot work with; the
// components validate their own settings.
func (c Config) Validate() error {
	switch {
	case c.Listener == nil && c.Addr == "":
		return errors.New("server: Config.Listener or Config.Addr is required")
	case c.DatabaseURL == "" && c.DataDir == "":
		return errors.New("server: Config.DataDir is required without Config.DatabaseURL")
	case c.Wake != WakeNotify && c.Wake != WakeLogical && c.Wake != WakePoll && c.Wake != WakeLocal:
		return errors.New("server: Config.Wake must be notify, logical, poll or local")
	case c.EncryptionKey != "" && len(c.EncryptionKey) != 64:
		return errors.New("server: Config.EncryptionKey must be 64 hex characters")
	case c.MaxConnections < 0:
		return errors.New("server: Config.MaxConnections must not be negative")
	case c.PartitionCleanupDays < 0 || c.PartitionCleanupDays > PartitionCleanupDaysMax:
		return fmt.Errorf("server: Config.PartitionCleanupDays must be between 0 and %d", PartitionCleanupDaysMax)
	case c.DBMaxConns < 0 || c.DBMaxConns > 0 && c.DBMaxConns < DBMinConns || c.DBMaxConns > DBMaxConnsMax:
		return fmt.Errorf("server: Config.DBMaxConns must be 0 or between %d and %d", DBMinConns, DBMaxConnsMax)
	case c.ShutdownTimeout < 0 || c.RetentionInterval < 0:
		return errors.New("server: Config.ShutdownTimeout and Config.RetentionInterval must not be negative")
	}
	return nil
}

// SyncOn reports whether syncnet runs: a secret, seeds, or Syncnet.
func (c *Config) SyncOn() bool { return c.SyncSecret != "" || len(c.SyncPeers) > 0 || c.Syncnet }

// AuthOn reports whether tokens are required: some key is configured.
func (c *Config) AuthOn() bool {
	return c.AuthSecret != "" || c.AuthPublicKey != "" || c.AuthJWKSURL != ""
}

// BufferDirOrDefault is the push buffer's directory: BufferDir, or
// DataDir/buffer.
func (c *Config) BufferDirOrDefault() string {
	if c.BufferDir != "" {
		return c.BufferDir
	}
	return filepath.Join(c.DataDir, "buffer")
}

// FlagDefaults are the components' defaults that herald's flags show, in
// one place: the binary reads them here, not from each package.
type FlagDefaults struct {
	BodyLimit, WSMaxConnections, SSEMaxConnections, MetricsMaxQueues int
	PollWorkers, PreflightMax, BufferMaxBytes                        int
	BodyReadTimeout, DBConnectTimeout, NotifyWindow                  time.Duration
	SweepMin, SweepMax, PreflightTimeout                             time.Duration
	SSEHeartbeat, SSEResumeGrace, SyncFreshness                      time.Duration
	RetentionInterval, TraceRetention                                time.Duration
}

// Defaults are the components' defaults (each package's own constants).
var Defaults = FlagDefaults{
	BodyLimit: gateway.BodyLimitDefault, WSMaxConnections: gateway.MaxWSConnectionsDefault,
	SSEMaxConnections: gateway.MaxSSEConnectionsDefault, MetricsMaxQueues: gateway.MetricsMaxQueuesDefault,
	PollWorkers: poller.WorkersDefault, PreflightMax: poller.MaxIntentionsPerPreflight, BufferMaxBytes: spool.MaxBytesDefault,
	BodyReadTimeout: gateway.BodyReadTimeoutDefault, DBConnectTimeout: queue.ConnectTimeoutDefault,
	NotifyWindow: pgnotify.WindowDefault, SweepMin: poller.SweepMinDefault, SweepMax: poller.SweepMaxDefault,
	PreflightTimeout: poller.PreflightTimeoutDefault, SSEHeartbeat: gateway.SSEHeartbeatDefault,
	SSEResumeGrace: gateway.SSEResumeGraceDefault, SyncFreshness: syncnet.FreshnessDefault,
	RetentionInterval: queue.RetentionIntervalDefault, TraceRetention: queue.TraceRetentionDefault,
}
