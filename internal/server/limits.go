package server

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/rs/zerolog"
)

// The descriptors an instance needs besides its client connections, which
// the connection cap (Config.MaxConnections) keeps free below the
// open-file limit:
//
//	cap = soft RLIMIT_NOFILE − reserve
//	reserve = pool + wakeConns + refusing + fixedReserve + soft/100
//
// pool is the database pool's MaxConns (--db-max-conns, or the URL's
// pool_max_conns); wakeConns the LISTEN connection (--listen-database-url)
// and the logical-replication connection, counted whether or not they are
// in use; refusing the connections past the cap held at once to be answered
// (gateway's refuseSlots); fixedReserve everything else of fixed size:
// stdin/out/err, the listener, the runtime's epoll and wake-up descriptors,
// syncnet's UDP socket, the push buffer's files and lock, the private
// PostgreSQL's start and users locks, its log and the pipes of a pg_ctl
// run, postmaster.pid and /proc reads, a JWKS fetch, the pprof listener.
// soft/100 is a margin for what grows with the host (DNS lookups of
// syncnet peers, Go's own). At 1,024 with the default pool of 4 that is
// 4 + 2 + 64 + 64 + 10 = 144, a cap of 880; at 65,536, 789 and 64,747.
const (
	wakeConns    = 2
	refusing     = 64 // gateway's refuseSlots
	fixedReserve = 64
	// minConnections: an open-file limit that leaves fewer client
	// connections than this is an operator's mistake, refused at start.
	minConnections = 16
)

// rlimInfinity is RLIM_INFINITY as the uint64 of syscall.Rlimit.
const rlimInfinity = ^uint64(0)

// connectionCap is the cap the open-file limit soft allows with a pool of
// pool connections, and the reserve it keeps.
func connectionCap(soft uint64, pool int) (limit, reserve int) {
	reserve = pool + wakeConns + refusing + fixedReserve + int(min(soft, 1<<30)/100)
	return int(min(soft, 1<<30)) - reserve, reserve
}

// raiseOpenFileLimit raises the soft RLIMIT_NOFILE to the hard limit (Go
// does so at start for itself, but hands processes it starts, such as
// pg_ctl and postgres, the original soft limit; Setrlimit makes them
// inherit the raised one) and returns the soft limit in force.
func raiseOpenFileLimit(log zerolog.Logger) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("reading the open-file limit: %w", err)
	}
	soft, target := lim.Cur, lim.Max
	if target == rlimInfinity {
		// The soft limit cannot pass the kernel's nr_open.
		target = nrOpen()
	}
	if lim.Cur < target {
		raised := syscall.Rlimit{Cur: target, Max: lim.Max}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			log.Warn().Err(err).Uint64("soft", lim.Cur).Uint64("hard", lim.Max).Msg("raising the open-file limit")
		} else {
			soft = target
		}
	}
	log.Info().Uint64("soft", soft).Uint64("hard", lim.Max).Msg("open-file limit (RLIMIT_NOFILE)")
	return soft, nil
}

// connectionLimit is the connection cap of c: MaxConnections, lowered to
// what the open-file limit soft allows (logged), or that when it is 0.
func connectionLimit(c *Config, soft uint64, pool int, log zerolog.Logger) (int, error) {
	allowed, reserve := connectionCap(soft, pool)
	if allowed < minConnections {
		return 0, fmt.Errorf("server: the open-file limit %d leaves %d connections after a reserve of %d for the database and files: raise it (ulimit -n)",
			soft, allowed, reserve)
	}
	limit := allowed
	switch {
	case c.MaxConnections > allowed:
		log.Warn().Int("max_connections", c.MaxConnections).Int("allowed", allowed).Uint64("open_file_limit", soft).
			Msg("--max-connections is above what the open-file limit allows: lowered")
	case c.MaxConnections > 0:
		limit = c.MaxConnections
	}
	log.Info().Int("max_connections", limit).Uint64("open_file_limit", soft).Int("reserve", reserve).Msg("connection cap")
	return limit, nil
}

// nrOpen is the kernel's ceiling on a process's descriptors
// (/proc/sys/fs/nr_open), 1,048,576 (its default) when unreadable.
func nrOpen() uint64 {
	b, err := os.ReadFile("/proc/sys/fs/nr_open")
	if err != nil {
		return 1 << 20
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 1 << 20
	}
	return n
}
