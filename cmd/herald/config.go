package main

import (
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/heraldmq/herald/auth"
	"github.com/heraldmq/herald/internal/server"
)

// config is everything `herald serve` and `herald migrate` read from flags
// and HERALD_* environment variables. A flag given on the command line wins
// over its environment variable, which wins over the default.
type config struct {
	// The instance's settings; the fields below are the command's own.
	server.Config

	LogLevel  string
	LogFormat string
	PprofAddr string
}

// Wake modes of --wake.
const (
	WakeNotify  = server.WakeNotify  // in-process wake-ups, and NOTIFY between instances
	WakeLogical = server.WakeLogical // in-process wake-ups, and the WAL's inserts via logical replication
	WakePoll    = server.WakePoll    // only the adaptive sweep (the reference server's way)
)

// option is one setting: its flag, environment variable, default and help.
// The same table drives flag parsing, --help and the configuration table
// of docs/operating.md (a test keeps that page in step).
type option struct {
	flag, env, def, help string
	set                  func(c *config, v string) error
}

var options = []option{
	{"addr", "HERALD_ADDR", ":6632", "HTTP listen address",
		func(c *config, v string) error { c.Addr = v; return nil }},
	{"database-url", "HERALD_DATABASE_URL", "", "PostgreSQL URL; empty starts a private PostgreSQL under --data-dir",
		func(c *config, v string) error { c.DatabaseURL = v; return nil }},
	{"data-dir", "HERALD_DATA_DIR", "./.herald", "directory of the private PostgreSQL (used only without --database-url) and, unless --buffer-dir says otherwise, of the push buffer (<data-dir>/buffer, with or without --database-url)",
		func(c *config, v string) error { c.DataDir = v; return nil }},
	{"log-level", "HERALD_LOG_LEVEL", "info", "debug, info, warn or error (request logs are debug)",
		func(c *config, v string) error { c.LogLevel = v; return nil }},
	{"log-format", "HERALD_LOG_FORMAT", "auto", "auto (console lines when stderr is a terminal, JSON otherwise), json or console",
		func(c *config, v string) error { c.LogFormat = v; return nil }},
	{"body-limit", "HERALD_BODY_LIMIT", strconv.Itoa(server.Defaults.BodyLimit), "largest request body in bytes (413 above)",
		func(c *config, v string) (err error) { c.BodyLimit, err = strconv.ParseInt(v, 10, 64); return err }},
	{"body-read-timeout", "HERALD_BODY_READ_TIMEOUT", server.Defaults.BodyReadTimeout.String(), "a request body not received within this (from the end of its headers) is answered 408 and its connection closed; requests without a body (long-polls, WebSocket, SSE) have no such deadline",
		func(c *config, v string) (err error) { c.BodyReadTimeout, err = time.ParseDuration(v); return err }},
	{"instance-id", "HERALD_INSTANCE_ID", "", "name of this instance, recorded as lease owner; unique among live instances (a second one with an id in use is refused); keep it across restarts: at start an instance gives back the leases its previous life's WebSocket and SSE streams held (leases popped over HTTP stay with their clients); empty means hostname:port",
		func(c *config, v string) error { c.InstanceID = v; return nil }},
	{"db-max-conns", "HERALD_DB_MAX_CONNS", "0", "database pool size: 0 means max(4, CPUs); at least 2 otherwise",
		func(c *config, v string) (err error) { c.DBMaxConns, err = strconv.Atoi(v); return err }},
	{"db-connect-timeout", "HERALD_DB_CONNECT_TIMEOUT", server.Defaults.DBConnectTimeout.String(), "how long one database connection attempt may take (per host of a multi-host URL) before the next host is tried or the request answered 503; a connect_timeout in --database-url wins",
		func(c *config, v string) (err error) { c.DBConnectTimeout, err = time.ParseDuration(v); return err }},
	{"pg-port", "HERALD_PG_PORT", "0", "TCP port of the private PostgreSQL on 127.0.0.1; 0 picks a free one",
		func(c *config, v string) (err error) { c.PGPort, err = strconv.Atoi(v); return err }},
	{"shutdown-timeout", "HERALD_SHUTDOWN_TIMEOUT", server.ShutdownTimeoutDefault.String(), "on shutdown, how long past --drain-window requests in flight may take; then every connection still open is closed (the whole shutdown takes at most the sum)",
		func(c *config, v string) (err error) { c.ShutdownTimeout, err = time.ParseDuration(v); return err }},
	{"wake", "HERALD_WAKE", "notify", "what wakes waiting consumers: notify (pushes wake this instance at once and others by NOTIFY), logical (every insert, from any producer, read from the WAL; needs wal_level=logical) or poll (only the adaptive sweep, the reference server's way)",
		func(c *config, v string) error { c.Wake = v; return nil }},
	{"listen-database-url", "HERALD_LISTEN_DATABASE_URL", "", "separate URL, straight to PostgreSQL, for the LISTEN connection (--wake notify) or the replication stream (--wake logical) when the main URL goes through a transaction-mode pooler; empty takes one from the pool",
		func(c *config, v string) error { c.ListenDatabaseURL = v; return nil }},
	{"ws-allowed-origins", "HERALD_WS_ALLOWED_ORIGINS", "", "comma-separated origins (scheme://host[:port]) besides Herald's own whose pages may open a WebSocket and use --auth-cookie; empty allows Herald's own origin only (its scheme, Host and port; behind a proxy that ends TLS, X-Forwarded-Proto gives the scheme)",
		func(c *config, v string) error { c.AllowedOrigins = splitList(v); return nil }},
	{"max-connections", "HERALD_MAX_CONNECTIONS", "0", "HTTP connections per instance, every transport together (WebSocket, SSE, long-poll, requests); past it a request is answered 503 with Retry-After (SSE: 200 with retry:) and its connection closed, open ones are untouched, /health and /metrics are still answered; 0 means what the open-file limit (raised to its hard limit at start) allows after a reserve for the database pool and files, and a larger value is lowered to that; --ws-max-connections and --sse-max-connections above it are lowered to it",
		func(c *config, v string) (err error) { c.MaxConnections, err = strconv.Atoi(v); return err }},
	{"ws-max-connections", "HERALD_WS_MAX_CONNECTIONS", strconv.Itoa(server.Defaults.WSMaxConnections), "WebSocket connections per instance; more are answered 503",
		func(c *config, v string) (err error) { c.MaxWSConnections, err = strconv.Atoi(v); return err }},
	{"notify-window", "HERALD_NOTIFY_WINDOW", server.Defaults.NotifyWindow.String(), "at most one NOTIFY per queue per this window",
		func(c *config, v string) (err error) { c.NotifyWindow, err = time.ParseDuration(v); return err }},
	{"poll-workers", "HERALD_POLL_WORKERS", strconv.Itoa(server.Defaults.PollWorkers), "poll cycles running side by side; each queue belongs to one",
		func(c *config, v string) (err error) { c.PollWorkers, err = strconv.Atoi(v); return err }},
	{"poll-sweep-min", "HERALD_POLL_SWEEP_MIN", server.Defaults.SweepMin.String(), "safety sweep interval right after work",
		func(c *config, v string) (err error) { c.SweepMin, err = time.ParseDuration(v); return err }},
	{"poll-sweep-max", "HERALD_POLL_SWEEP_MAX", server.Defaults.SweepMax.String(), "safety sweep interval when idle (it doubles up to this)",
		func(c *config, v string) (err error) { c.SweepMax, err = time.ParseDuration(v); return err }},
	{"preflight-timeout", "HERALD_PREFLIGHT_TIMEOUT", server.Defaults.PreflightTimeout.String(), "pre-flight queries slower than this are logged",
		func(c *config, v string) (err error) { c.PreflightTimeout, err = time.ParseDuration(v); return err }},
	{"preflight-max", "HERALD_PREFLIGHT_MAX", strconv.Itoa(server.Defaults.PreflightMax), "distinct waiting targets per pre-flight query; more are split",
		func(c *config, v string) (err error) { c.PreflightMax, err = strconv.Atoi(v); return err }},
	{"auth-secret", "HERALD_AUTH_SECRET", "", "HMAC secret (at least 32 bytes) of the bearer tokens (HS256, HS384, HS512) every endpoint but /health and /metrics then requires; auth is on when this, --auth-public-key or --auth-jwks-url is set",
		func(c *config, v string) error { c.AuthSecret = v; return nil }},
	{"auth-public-key", "HERALD_AUTH_PUBLIC_KEY", "", "PEM file of a public key that verifies bearer tokens (RSA: RS256/384/512, PS256/384/512; EC: ES256/384/512; Ed25519: EdDSA); the algorithm comes from the key, never from the token",
		func(c *config, v string) error { c.AuthPublicKey = v; return nil }},
	{"auth-jwks-url", "HERALD_AUTH_JWKS_URL", "", "URL of a JWKS (an identity provider's jwks_uri) whose keys verify bearer tokens that name their kid; fetched at start, every 15 minutes, and on an unknown kid at most every 30 s; a failed fetch keeps the last good set",
		func(c *config, v string) error { c.AuthJWKSURL = v; return nil }},
	{"auth-cookie", "HERALD_AUTH_COOKIE", "", "name of a cookie that may carry the bearer token (for EventSource, which cannot set headers, without the token in the URL); honoured only from Herald's own origin or --ws-allowed-origins, and for a change (push, ack, pop, admin) only with the header X-Herald-CSRF; set it HttpOnly, Secure, SameSite=Strict or Lax; empty accepts none",
		func(c *config, v string) error { c.AuthCookie = v; return nil }},
	{"auth-issuer", "HERALD_AUTH_ISSUER", "", "when set, a token's iss must equal it",
		func(c *config, v string) error { c.AuthIssuer = v; return nil }},
	{"auth-audience", "HERALD_AUTH_AUDIENCE", "", "when set, a token's aud must contain it",
		func(c *config, v string) error { c.AuthAudience = v; return nil }},
	{"metrics-max-queues", "HERALD_METRICS_MAX_QUEUES", strconv.Itoa(server.Defaults.MetricsMaxQueues), "distinct queues that get a queue label value of their own in /metrics (the first seen since start); the others share queue=\"__other__\"; 0 names none",
		func(c *config, v string) (err error) { c.MetricsMaxQueues, err = strconv.Atoi(v); return err }},
	{"metrics-group-labels", "HERALD_METRICS_GROUP_LABELS", "false", "name consumer groups in the group label of herald_messages_popped_total (as many as --metrics-max-queues, the rest \"__other__\"); off, a named group is \"__other__\" and queue mode \"__QUEUE_MODE__\"",
		func(c *config, v string) (err error) { c.MetricsGroupLabels, err = strconv.ParseBool(v); return err }},
	{"metrics-auth", "HERALD_METRICS_AUTH", "false", "require a bearer token with role admin on /metrics (needs auth on: --auth-secret, --auth-public-key or --auth-jwks-url); off, /metrics is open as /health is",
		func(c *config, v string) (err error) { c.MetricsAuth, err = strconv.ParseBool(v); return err }},
	{"sse-max-connections", "HERALD_SSE_MAX_CONNECTIONS", strconv.Itoa(server.Defaults.SSEMaxConnections), "SSE streams per instance; more are answered 200 with retry: and closed",
		func(c *config, v string) (err error) { c.MaxSSEConnections, err = strconv.Atoi(v); return err }},
	{"sse-heartbeat", "HERALD_SSE_HEARTBEAT", server.Defaults.SSEHeartbeat.String(), "interval of SSE heartbeat comments (keep it under proxies' read timeouts)",
		func(c *config, v string) (err error) { c.SSEHeartbeat, err = time.ParseDuration(v); return err }},
	{"sse-resume-grace", "HERALD_SSE_RESUME_GRACE", server.Defaults.SSEResumeGrace.String(), "how long a closed SSE stream's unacked leases wait for its browser to resume with Last-Event-ID before other consumers get them",
		func(c *config, v string) (err error) { c.SSEResumeGrace, err = time.ParseDuration(v); return err }},
	{"sync-peers", "HERALD_SYNC_PEERS", "", "optional seeds: comma-separated host:port of syncnet sockets heard from whether or not the members table lists them (the reference server, or where an advertised address is not the one to use; names re-resolved every 30 s); needs --sync-secret",
		func(c *config, v string) error { c.SyncPeers = splitList(v); return nil }},
	{"sync-bind", "HERALD_SYNC_BIND", ":6633", "UDP address syncnet listens on",
		func(c *config, v string) error { c.SyncBind = v; return nil }},
	{"sync-secret", "HERALD_SYNC_SECRET", "", "64 hex characters signing syncnet datagrams (HMAC-SHA256 over the ASCII bytes, as the reference server); set, it turns syncnet on: the peers are the instances the database's members table lists, found with no list; empty turns syncnet off",
		func(c *config, v string) error { c.SyncSecret = v; return nil }},
	{"sync-advertise", "HERALD_SYNC_ADVERTISE", "", "host:port the other instances send syncnet datagrams to, written in the members table (behind NAT, or a Kubernetes pod's address); empty means --sync-bind when it names a host, else this instance's address on its database connection with the bound port",
		func(c *config, v string) error { c.SyncAdvertise = v; return nil }},
	{"sync-freshness", "HERALD_SYNC_FRESHNESS", server.Defaults.SyncFreshness.String(), "how far a syncnet datagram's signed timestamp may be from this clock, either way (older or newer is dropped as a replay); must exceed the clock skew between instances",
		func(c *config, v string) (err error) { c.SyncFreshness, err = time.ParseDuration(v); return err }},
	{"server-id", "HERALD_SERVER_ID", "", "this instance's name on syncnet; empty means hostname:port of --sync-bind",
		func(c *config, v string) error { c.ServerID = v; return nil }},
	{"encryption-key", "HERALD_ENCRYPTION_KEY", "", "64 hex characters: the AES-256-GCM key of the payloads of queues configured with encryptionEnabled (checked at start against the database's key check value); empty refuses such queues",
		func(c *config, v string) error { c.EncryptionKey = v; return nil }},
	{"retention-interval", "HERALD_RETENTION_INTERVAL", server.Defaults.RetentionInterval.String(), "how often retention runs (on one instance, whatever the instances: an advisory lock and the chores table): deletes messages past a queue's retentionSeconds, and those every group acknowledged past its completedRetentionSeconds",
		func(c *config, v string) (err error) { c.RetentionInterval, err = time.ParseDuration(v); return err }},
	{"partition-cleanup-days", "HERALD_PARTITION_CLEANUP_DAYS", "7", "retention deletes partitions with no messages, no dead letters and no push or lease for this many days (and tells syncnet peers); 0 keeps them; at most 36500",
		func(c *config, v string) (err error) { c.PartitionCleanupDays, err = strconv.Atoi(v); return err }},
	{"trace-retention", "HERALD_TRACE_RETENTION", server.Defaults.TraceRetention.String(), "traces (POST /api/v1/traces) older than this are deleted, checked every 30 s by each instance in batches of 5,000; they outlive their message until then, and go with their queue; 0 keeps them forever",
		func(c *config, v string) (err error) { c.TraceRetention, err = time.ParseDuration(v); return err }},
	{"pprof-addr", "HERALD_PPROF_ADDR", "", "address of a separate listener serving Go's /debug/pprof profiles (e.g. 127.0.0.1:6060; keep it off public interfaces); empty serves none",
		func(c *config, v string) error { c.PprofAddr = v; return nil }},
	{"buffer-dir", "HERALD_BUFFER_DIR", "", "directory of this instance's push buffer, where pushes go during push maintenance (POST /api/v1/system/maintenance) until it ends and they are drained into the database; keep it on a persistent disk; empty means <data-dir>/buffer (instances sharing a directory take a file each), and if that cannot be created the instance runs without a buffer and answers such pushes 503",
		func(c *config, v string) error { c.BufferDir = v; return nil }},
	{"buffer-max-bytes", "HERALD_BUFFER_MAX_BYTES", strconv.Itoa(server.Defaults.BufferMaxBytes), "largest size of the push buffer file; a push during push maintenance that would pass it is answered 503",
		func(c *config, v string) (err error) { c.BufferMaxBytes, err = strconv.ParseInt(v, 10, 64); return err }},
	{"drain-window", "HERALD_DRAIN_WINDOW", "5s", "on shutdown, WebSocket and SSE connections are closed at random points of this window, so clients do not reconnect in one storm",
		func(c *config, v string) (err error) { c.DrainWindow, err = time.ParseDuration(v); return err }},
}

// parseConfig reads defaults, then the environment, then args.
func parseConfig(cmd string, args []string, getenv func(string) string, out io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("herald "+cmd, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { usage(out, cmd) }
	for _, o := range options {
		v := o.def
		if e := getenv(o.env); e != "" {
			v = e
		}
		if err := o.set(c, v); err != nil {
			return nil, fmt.Errorf("%s=%q: %w", o.env, v, err)
		}
		if o.def == "false" {
			// A switch: --flag alone turns it on, --flag=false off.
			fs.BoolFunc(o.flag, o.help, func(v string) error { return o.set(c, v) })
		} else {
			fs.Func(o.flag, o.help, func(v string) error { return o.set(c, v) })
		}
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return c, c.validate()
}

func (c *config) validate() error {
	switch {
	case c.Addr == "":
		return errors.New("--addr must not be empty")
	case c.DatabaseURL == "" && c.DataDir == "":
		return errors.New("--data-dir must not be empty without --database-url")
	case c.BodyLimit <= 0:
		return errors.New("--body-limit must be positive")
	case c.DBMaxConns < 0 || c.DBMaxConns > 0 && c.DBMaxConns < server.DBMinConns || c.DBMaxConns > server.DBMaxConnsMax:
		return fmt.Errorf("--db-max-conns must be 0 (max(4, CPUs)) or between %d and %d: retention and hygiene hold one connection while they work on another",
			server.DBMinConns, server.DBMaxConnsMax)
	case c.DBConnectTimeout < 0 || c.DBConnectTimeout > time.Hour:
		return errors.New("--db-connect-timeout must be between 0 (the default) and 1h")
	case c.PGPort < 0 || c.PGPort > 65535:
		return errors.New("--pg-port must be a TCP port")
	case c.EncryptionKey != "" && !validSecret(c.EncryptionKey):
		return errors.New("--encryption-key must be 64 hex characters")
	case c.PartitionCleanupDays < 0 || c.PartitionCleanupDays > server.PartitionCleanupDaysMax:
		return fmt.Errorf("--partition-cleanup-days must be between 0 (keep them) and %d", server.PartitionCleanupDaysMax)
	case c.TraceRetention < 0:
		return errors.New("--trace-retention must not be negative (0 keeps traces forever)")
	case c.RetentionInterval <= 0:
		return errors.New("--retention-interval must be positive")
	case c.ShutdownTimeout <= 0:
		return errors.New("--shutdown-timeout must be positive")
	case c.BodyReadTimeout <= 0:
		return errors.New("--body-read-timeout must be positive")
	case c.Wake != WakeNotify && c.Wake != WakeLogical && c.Wake != WakePoll:
		return errors.New("--wake must be notify, logical or poll")
	case c.NotifyWindow <= 0:
		return errors.New("--notify-window must be positive")
	case c.MaxConnections < 0:
		return errors.New("--max-connections must not be negative (0: what the open-file limit allows)")
	case c.MaxWSConnections < 1:
		return errors.New("--ws-max-connections must be positive")
	case c.PollWorkers < 1 || c.PollWorkers > 64:
		return errors.New("--poll-workers must be between 1 and 64")
	case c.SweepMin <= 0 || c.SweepMax < c.SweepMin:
		return errors.New("--poll-sweep-min must be positive and at most --poll-sweep-max")
	case c.PreflightTimeout <= 0:
		return errors.New("--preflight-timeout must be positive")
	case c.PreflightMax < 1:
		return errors.New("--preflight-max must be positive")
	case c.AuthSecret != "" && len(c.AuthSecret) < 32:
		return errors.New("--auth-secret must be at least 32 bytes")
	case c.MaxSSEConnections < 1:
		return errors.New("--sse-max-connections must be positive")
	case c.SSEHeartbeat <= 0 || c.SSEResumeGrace <= 0:
		return errors.New("--sse-heartbeat and --sse-resume-grace must be positive")
	case c.DrainWindow < 0:
		return errors.New("--drain-window must not be negative")
	case c.BufferMaxBytes < 1<<20:
		return errors.New("--buffer-max-bytes must be at least 1048576 (1 MiB)")
	case c.MetricsMaxQueues < 0:
		return errors.New("--metrics-max-queues must not be negative")
	case c.MetricsAuth && !c.AuthOn():
		return errors.New("--metrics-auth needs auth on (--auth-secret, --auth-public-key or --auth-jwks-url): there are no tokens to check without it")
	case c.SyncFreshness <= 0 || c.SyncFreshness > time.Hour:
		return errors.New("--sync-freshness must be positive and at most 1h (a wider window lets older datagrams be replayed)")
	case (len(c.SyncPeers) > 0 || c.SyncSecret != "") && !validSecret(c.SyncSecret):
		return errors.New("--sync-secret must be 64 hex characters (syncnet on: --sync-secret or --sync-peers set)")
	}
	for _, o := range c.AllowedOrigins {
		if !auth.ValidOrigin(o) {
			return fmt.Errorf("--ws-allowed-origins: %q is not an origin: scheme://host[:port], http or https, no path (there is no wildcard)", o)
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return errors.New("--log-level must be debug, info, warn or error")
	}
	switch c.LogFormat {
	case "auto", "json", "console":
	default:
		return errors.New("--log-format must be auto, json or console")
	}
	for _, u := range []struct{ flag, url string }{{"--database-url", c.DatabaseURL}, {"--listen-database-url", c.ListenDatabaseURL}} {
		if err := checkPostgresURL(u.flag, u.url); err != nil {
			return err
		}
	}
	return nil
}

// checkPostgresURL refuses a URL of another scheme with a message that says
// what is expected (pgx alone answers "cannot parse"). A keyword/value
// string ("host=… dbname=…") has no scheme and is left to pgx.
func checkPostgresURL(flag, v string) error {
	scheme, _, ok := strings.Cut(v, "://")
	if !ok || scheme == "postgres" || scheme == "postgresql" {
		return nil
	}
	return fmt.Errorf("%s must be a PostgreSQL URL (postgres://user:password@host:5432/database), not a %s:// URL", flag, scheme)
}

func validSecret(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func usage(w io.Writer, cmd string) {
	fmt.Fprintf(w, `Herald: a push gateway over a partitioned message queue in PostgreSQL.

Usage:
  herald [serve] [flags]   run the server (the default command)
  herald migrate [flags]   apply database migrations and exit
  herald demo [flags]      three instances with syncnet on one private PostgreSQL, and a
                           demo producer (herald demo -h for its flags)
  herald produce [flags]   push a few demo messages a second (herald produce -h)
  herald health [--url U]  exit 0 when U (default http://127.0.0.1:6632/health) answers 200
  herald token [flags]     sign a development token with --auth-secret (herald token -h)
  herald version           print the version and commit (also --version, -v)

Flags (each also read from its environment variable):
`)
	// Columns as wide as the longest flag and variable; the meaning wraps
	// under its own column.
	fw, ew := 0, 0
	for _, o := range options {
		fw, ew = max(fw, len(o.flag)+2), max(ew, len(o.env))
	}
	indent := strings.Repeat(" ", 2+fw+2+ew+2)
	for _, o := range options {
		def := o.def
		if def == "" {
			def = `""`
		}
		lines := wrap(o.help+" (default "+def+")", max(helpWidth-len(indent), 30))
		fmt.Fprintf(w, "  %-*s  %-*s  %s\n", fw, "--"+o.flag, ew, o.env, lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(w, "%s%s\n", indent, l)
		}
	}
	_ = cmd
}

// helpWidth is the line length --help wraps its flag list to.
const helpWidth = 120

// wrap breaks s into lines of at most width characters at spaces (a longer
// word gets a line of its own).
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	return append(lines, line)
}

// markdownTable renders the options as docs/operating.md's configuration table.
func markdownTable() string {
	var b strings.Builder
	b.WriteString("| flag | environment | default | meaning |\n|---|---|---|---|\n")
	for _, o := range options {
		def := "`" + o.def + "`"
		if o.def == "" {
			def = "(empty)"
		}
		fmt.Fprintf(&b, "| `--%s` | `%s` | %s | %s |\n", o.flag, o.env, def, o.help)
	}
	return b.String()
}

// getenv is os.Getenv, replaceable in tests.
var getenv = os.Getenv

// splitList splits a comma-separated list, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
