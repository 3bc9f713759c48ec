package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
)

// Config describes a private cluster. Only Dir is required.
type Config struct {
	// Dir is the root directory, dedicated to the cluster: it lives in
	// Dir/pgdata, the server log in Dir/postgres.log and the Unix socket
	// directly in Dir. It is created if missing. When running as root the
	// whole tree is handed to the postgres OS user.
	Dir string
	// Port is the TCP port on 127.0.0.1. Zero picks a free port on every
	// start; a reused postmaster keeps whatever port it already has.
	Port int
	// Database is created on start if missing. Zero means "herald".
	Database string
	// Settings are extra postgresql.conf settings passed as -c k=v when this
	// process starts the postmaster (e.g. fsync=off). They override the
	// defaults below except port, which the URL depends on. They are ignored
	// when an already running postmaster is reused.
	Settings map[string]string
	// Logger receives progress messages. The zero value discards them, which
	// zerolog guarantees for a Logger without a writer.
	Logger zerolog.Logger
}

// Cluster is a postmaster serving Config.Dir. Its methods are safe for
// concurrent use.
type Cluster struct {
	url   string
	port  int         // the TCP port url names, which Supervise's restarts keep
	cfg   Config      // as Start completed it, for Supervise's restarts
	owned atomic.Bool // set by Start, and by Supervise when it restarts the postmaster
	stop  func() error
	srv   *server
	users *os.File // holds a shared flock on Dir/users.lock while this handle uses the cluster
	relMu sync.Mutex

	stopping atomic.Bool // set by Stop and Release: Supervise must not restart what they stop
	healthMu sync.Mutex
	health   Health
}

// startTimeout bounds Start as a whole, so that waiting on a postmaster that
// never becomes ready ends in an error even if the caller's ctx has no deadline.
const startTimeout = 2 * time.Minute

// Start makes sure a postmaster serves cfg.Dir and cfg.Database exists.
//
// It runs initdb on first use, reuses a postmaster already running for the
// directory (Owned reports false then), clears the postmaster.pid left by a
// crashed one, and otherwise starts a new postmaster with pg_ctl.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Dir == "" {
		return nil, errors.New("starting postgres: Config.Dir is required")
	}
	if cfg.Database == "" {
		cfg.Database = "herald"
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()

	s, err := newServer(cfg)
	if err != nil {
		return nil, err
	}
	unlock, err := lockDir(ctx, s.dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.initdb(ctx); err != nil {
		return nil, err
	}
	port, owned, err := s.start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	c := &Cluster{url: clusterURL(port, cfg.Database), port: port, cfg: cfg, srv: s, stop: sync.OnceValue(s.stop)}
	c.owned.Store(owned)
	if c.users, err = shareUsers(s.dir); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	if err := createDatabase(ctx, port, cfg.Database); err != nil {
		// Do not leave a postmaster behind that nobody holds a handle to.
		return nil, errors.Join(err, c.Stop())
	}
	s.log.Info().Str("dir", s.dir).Int("port", port).Bool("owned", owned).Msg("postgres ready")
	return c, nil
}

// URL returns a connection URL for the cluster's database, e.g.
// postgres://postgres@127.0.0.1:5432/herald?sslmode=disable.
func (c *Cluster) URL() string { return c.url }

// Owned reports whether this process started the postmaster (at Start, or
// when Supervise restarted it). A reused postmaster belongs to whoever
// started it, so Stop leaves it running.
func (c *Cluster) Owned() bool { return c.owned.Load() }

// Stop shuts the postmaster down with pg_ctl stop -m fast if this process
// started it, and does nothing otherwise. Either way Supervise stops
// restarting it. Calling it again returns the first call's result.
func (c *Cluster) Stop() error {
	c.stopping.Store(true)
	if !c.owned.Load() {
		return nil
	}
	return c.stop()
}

// server holds what the pg_ctl and initdb invocations for one Dir share.
type server struct {
	bin    string
	dir    string // absolute, symlinks resolved
	pgdata string // absolute, symlinks resolved once it exists
	own    *owner // non-nil when we are root and postgres must run as another user
	log    zerolog.Logger
}

func newServer(cfg Config) (*server, error) {
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", cfg.Dir, err)
	}
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	own, err := lookupOwner()
	if err != nil {
		return nil, err
	}
	if err := prepareDir(dir, own); err != nil {
		return nil, err
	}
	// Resolve symlinks so paths compare equal to /proc/PID/cwd.
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		return nil, fmt.Errorf("resolving %s: %w", cfg.Dir, err)
	}
	// pg_ctl pastes -D and -l into a /bin/sh command line inside double
	// quotes, so these characters would break or inject into it.
	if strings.ContainsAny(dir, "\"$`\\\n") {
		return nil, fmt.Errorf("starting postgres: directory %q contains characters pg_ctl cannot quote", dir)
	}
	return &server{bin: bin, dir: dir, pgdata: filepath.Join(dir, "pgdata"), own: own, log: cfg.Logger}, nil
}

// prepareDir creates dir and, when running as root, hands it to postgres.
func prepareDir(dir string, own *owner) error {
	// Parents get 0755 so that postgres can traverse directories we create.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(dir), err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	if own == nil {
		return nil
	}
	if err := own.checkTraversable(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := own.chownTree(dir); err != nil {
		return err
	}
	// postgres refuses a data directory others can read; a tree copied
	// around by root may have lost initdb's 0700.
	if err := os.Chmod(filepath.Join(dir, "pgdata"), 0o700); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("restricting data directory: %w", err)
	}
	return nil
}

// lockDir serializes Starts on one Dir, within this process and across
// processes, so that two of them never run initdb or pg_ctl start at once.
// The kernel drops a flock when its holder dies, so a crash cannot leave the
// directory locked.
func lockDir(ctx context.Context, dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, "start.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening start lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("locking %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("waiting for another Start on %s: %w", dir, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// command prepares a PostgreSQL binary to run as the cluster's owner.
func (s *server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	// Our own working directory (e.g. /root) may be unreadable for postgres,
	// which makes initdb and postgres complain.
	cmd.Dir = s.dir
	if s.own != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.own.cred}
	}
	return cmd
}

// initdb creates the cluster unless it exists. It initializes a sibling
// directory and renames it into place, so an initdb killed halfway leaves
// nothing that a later start would mistake for a usable cluster.
func (s *server) initdb(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(s.pgdata, "PG_VERSION")); err == nil {
		return s.resolvePGData()
	}
	tmp := s.pgdata + ".initdb"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("removing leftover %s: %w", tmp, err)
	}
	s.log.Info().Str("dir", s.pgdata).Msg("initializing postgres cluster")
	out, err := s.command(ctx, "initdb", "-D", tmp, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("initializing postgres cluster in %s: %w", s.pgdata, ctx.Err())
		}
		// initdb's transcript is long: it goes to a file the error names.
		logPath := filepath.Join(s.dir, "initdb.log")
		if werr := os.WriteFile(logPath, out, 0o600); werr != nil {
			return fmt.Errorf("initializing postgres cluster in %s: %w: %s", s.pgdata, err, bytes.TrimSpace(out))
		}
		return fmt.Errorf("initializing postgres cluster in %s: %w (initdb's output is in %s)", s.pgdata, err, logPath)
	}
	// Rename succeeds onto a missing or empty pgdata and fails on one with
	// unrelated content, which we must not touch.
	if err := os.Rename(tmp, s.pgdata); err != nil {
		return fmt.Errorf("moving new cluster into place: %w", err)
	}
	return s.resolvePGData()
}

// resolvePGData resolves a symlinked pgdata, as postgres's cwd will be.
func (s *server) resolvePGData() error {
	p, err := filepath.EvalSymlinks(s.pgdata)
	if err != nil {
		return fmt.Errorf("resolving data directory: %w", err)
	}
	s.pgdata = p
	return nil
}

// start makes a postmaster serve pgdata and returns its port and whether we
// started it. It polls rather than failing at once when a postmaster is still
// coming up or the remnants of a dead one are still exiting.
func (s *server) start(ctx context.Context, cfg Config) (int, bool, error) {
	var lastWait string
	for {
		port, wait, err := s.reusable(ctx)
		switch {
		case err != nil:
			return 0, false, err
		case port != 0:
			s.log.Info().Int("port", port).Msg("reusing running postgres")
			if len(cfg.Settings) > 0 || (cfg.Port != 0 && cfg.Port != port) {
				s.log.Warn().Msg("postgres was already running: Port and Settings not applied")
			}
			return port, false, nil
		case wait == nil:
			port, err = s.pgCtlStart(ctx, cfg)
			if err == nil {
				return port, true, nil
			}
			if !transient(err, cfg.Port != 0) {
				return 0, false, err
			}
			wait = err
		}
		if wait.Error() != lastWait { // say why we wait, but once per reason
			lastWait = wait.Error()
			s.log.Info().Err(wait).Msg("waiting before starting postgres")
		}
		select {
		case <-ctx.Done():
			return 0, false, fmt.Errorf("starting postgres: %w; last waited on: %w", ctx.Err(), wait)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// reusable inspects pgdata. It returns the port of a live postmaster that
// answers, or a non-nil wait reason if something is in the way that should go
// away by itself, or neither if a new postmaster can be started. It removes a
// stale postmaster.pid and Unix socket lock files on the way, because
// postgres only checks whether their PID is alive and a recycled PID (or a
// zombie) would block it forever.
func (s *server) reusable(ctx context.Context) (port int, wait error, err error) {
	pidPath := filepath.Join(s.pgdata, "postmaster.pid")
	pf, err := readPIDFile(s.pgdata)
	if errors.Is(err, fs.ErrNotExist) {
		if pids := procsIn(s.pgdata); len(pids) > 0 {
			return 0, fmt.Errorf("processes %v work in %s without postmaster.pid", pids, s.pgdata), nil
		}
		return 0, nil, nil
	}
	if err == nil && servesDir(pf.pid, s.pgdata) {
		if err := ping(ctx, pf.port); err != nil {
			return 0, fmt.Errorf("postgres (pid %d) runs for %s but does not answer on port %d: %w",
				pf.pid, s.pgdata, pf.port, err), nil
		}
		return pf.port, nil, nil
	}
	if pids := procsIn(s.pgdata); len(pids) > 0 {
		return 0, fmt.Errorf("processes %v of a dead postmaster still work in %s", pids, s.pgdata), nil
	}
	s.log.Warn().Int("pid", pf.pid).Msg("removing stale postmaster.pid")
	if err := os.Remove(pidPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, nil, fmt.Errorf("removing stale %s: %w", pidPath, err)
	}
	locks, _ := filepath.Glob(filepath.Join(s.dir, ".s.PGSQL.*")) // pattern is valid
	for _, p := range locks {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, nil, fmt.Errorf("removing stale socket file: %w", err)
		}
	}
	return 0, nil, nil
}

// startError is a failed pg_ctl start together with the server log it wrote.
type startError struct {
	err     error
	out     []byte
	logPath string
	log     string
}

func (e *startError) Error() string {
	return fmt.Sprintf("starting postgres: %v: %s\n--- tail of %s ---\n%s",
		e.err, bytes.TrimSpace(e.out), e.logPath, e.log)
}

func (e *startError) Unwrap() error { return e.err }

// transient reports whether a start failure may go away on retry: a port
// that we picked got taken meanwhile, another process started the cluster
// concurrently, or old children still hold shared memory.
func transient(err error, fixedPort bool) bool {
	var se *startError
	if !errors.As(err, &se) {
		return false
	}
	return (!fixedPort && strings.Contains(se.log, "Address already in use")) ||
		strings.Contains(se.log, "already exists") ||
		strings.Contains(se.log, "pre-existing shared memory block")
}

// pgCtlStart starts a postmaster and waits until it accepts connections.
func (s *server) pgCtlStart(ctx context.Context, cfg Config) (int, error) {
	port := cfg.Port
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return 0, err
		}
	}
	logPath := filepath.Join(s.dir, "postgres.log")
	var offset int64
	if fi, err := os.Stat(logPath); err == nil {
		offset = fi.Size() // report only what this attempt logged
	}
	opts := postgresOptions(port, socketDir(s.dir), cfg.Settings)
	s.log.Info().Int("port", port).Str("options", opts).Msg("starting postgres")
	out, err := s.command(ctx, "pg_ctl", "start", "-w", "-t", "60",
		"-D", s.pgdata, "-l", logPath, "-o", opts).CombinedOutput()
	if err != nil {
		return 0, &startError{err: err, out: out, logPath: logPath, log: tail(logPath, offset)}
	}
	return port, nil
}

// stop runs pg_ctl stop; a fresh context because Start's has long ended.
func (s *server) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := s.command(ctx, "pg_ctl", "stop", "-w", "-t", "60", "-m", "fast", "-D", s.pgdata).CombinedOutput()
	if err != nil {
		return fmt.Errorf("stopping postgres: %w: %s", err, bytes.TrimSpace(out))
	}
	s.log.Info().Str("dir", s.dir).Msg("postgres stopped")
	return nil
}

// postgresOptions builds pg_ctl's -o string. pg_ctl runs it through /bin/sh,
// so every -c argument is single-quoted.
func postgresOptions(port int, sockDir string, settings map[string]string) string {
	all := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": sockDir,
		"wal_level":               "logical",
		"max_wal_senders":         "10",
		"max_replication_slots":   "10",
	}
	maps.Copy(all, settings)
	all["port"] = strconv.Itoa(port)
	args := make([]string, 0, len(all))
	for _, k := range slices.Sorted(maps.Keys(all)) {
		args = append(args, "-c "+shellQuote(k+"="+all[k]))
	}
	return strings.Join(args, " ")
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// maxSocketPath is the longest Unix socket path Linux accepts
// (sizeof(sun_path) minus the terminating NUL).
const maxSocketPath = 107

// socketDir returns dir if a socket in it fits into sun_path, and "" (TCP
// only) otherwise: postgres refuses to start on a too long socket path, and
// temp directories can be deep.
func socketDir(dir string) string {
	if len(dir)+len("/.s.PGSQL.65535") > maxSocketPath {
		return ""
	}
	return dir
}

// freePort asks the kernel for an unused port. Another process may grab it
// before postgres binds it; start retries in that case.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("picking a free port: %w", err)
	}
	defer func() { _ = l.Close() }() // only probed for its port
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tail returns the last lines written to path after offset.
func tail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read: %v)", err)
	}
	defer func() { _ = f.Close() }() // read-only
	const maxTail = 4 << 10
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > maxTail {
		offset = fi.Size() - maxTail
	}
	b, err := io.ReadAll(io.NewSectionReader(f, offset, maxTail))
	if err != nil {
		return fmt.Sprintf("(cannot read: %v)", err)
	}
	return string(bytes.TrimSpace(b))
}

func clusterURL(port int, db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// ping checks that a postmaster accepts connections on port.
func ping(ctx context.Context, port int) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, clusterURL(port, "postgres"))
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// createDatabase creates db unless it exists.
func createDatabase(ctx context.Context, port int, db string) error {
	conn, err := pgx.Connect(ctx, clusterURL(port, "postgres"))
	if err != nil {
		return fmt.Errorf("connecting to postgres: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }() // the work is done or failed already
	var exists bool
	err = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", db).Scan(&exists)
	if err != nil {
		return fmt.Errorf("checking for database %s: %w", db, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database
		return nil // another Start created it concurrently
	}
	if err != nil {
		return fmt.Errorf("creating database %s: %w", db, err)
	}
	return nil
}
