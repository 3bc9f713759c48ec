package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgBin holds initdb, pg_ctl and postgres (Debian's layout).
const pgBin = "/usr/lib/postgresql/15/bin"

// postgres is the one PostgreSQL cluster of a run: Herald, River and
// pg-floor use it, in databases of their own, with fsync and
// synchronous_commit on (the defaults).
type postgres struct {
	dir  string // temporary directory: data, socket, log
	port int
	pid  int // postmaster
	asPG bool
}

// startPostgres runs initdb and pg_ctl start in a temporary directory. As
// root it runs them as the postgres user, since PostgreSQL refuses root.
func startPostgres(ctx context.Context) (*postgres, error) {
	dir, err := os.MkdirTemp("", "herald-peers-pg-")
	if err != nil {
		return nil, fmt.Errorf("creating the PostgreSQL directory: %w", err)
	}
	p := &postgres{dir: dir, asPG: os.Geteuid() == 0}
	if p.asPG {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("looking up the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, fmt.Errorf("handing the PostgreSQL directory to postgres: %w", err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("finding a free port: %w", err)
	}
	p.port = ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	data := filepath.Join(dir, "data")
	// --no-sync only skips initdb's own final fsync; the server runs with
	// fsync on.
	if out, err := p.command(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
		"--locale=C", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("running initdb: %w: %s", err, out)
	}
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -c port=%d -c unix_socket_directories=%s "+
		"-c max_connections=300 -c wal_level=logical -c max_wal_senders=10 -c max_replication_slots=10 "+
		"-c fsync=on -c synchronous_commit=on", p.port, dir)
	if out, err := p.command(ctx, "pg_ctl", "start", "-w", "-t", "60", "-D", data,
		"-l", filepath.Join(dir, "log"), "-o", opts).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("running pg_ctl start: %w: %s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid")) // #nosec G304 -- our own temporary directory
	if err != nil {
		return nil, fmt.Errorf("reading postmaster.pid: %w", err)
	}
	p.pid, _ = strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	conn, err := pgx.Connect(ctx, p.url("postgres"))
	if err != nil {
		return nil, fmt.Errorf("connecting to the new cluster: %w", err)
	}
	defer func() { _ = conn.Close(ctx) }()
	for _, db := range []string{"herald", "river", "pgfloor", "pgfloorasync"} {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+db); err != nil {
			return nil, fmt.Errorf("creating database %s: %w", db, err)
		}
	}
	return p, nil
}

func (p *postgres) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	bin := filepath.Join(pgBin, name)
	if p.asPG {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", "postgres", "--", bin}, args...)...)
	}
	return exec.CommandContext(ctx, bin, args...)
}

func (p *postgres) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, db)
}

// cpu is the CPU time of the postmaster and all its children (backends,
// WAL writer, checkpointer, …) alive now. A backend that exits between two
// readings loses its share, so the systems keep their connections open.
func (p *postgres) cpu() time.Duration {
	total := procCPU(p.pid)
	for _, pid := range children(p.pid) {
		total += procCPU(pid)
	}
	return total
}

func (p *postgres) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = p.command(ctx, "pg_ctl", "stop", "-w", "-m", "fast", "-D", filepath.Join(p.dir, "data")).CombinedOutput()
	_ = os.RemoveAll(p.dir)
}
