package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/heraldmq/herald/internal/benchstat"
	"github.com/heraldmq/herald/internal/fanoutload"
)

// server is the Herald under measurement.
type server struct {
	url   string
	pid   int
	cmd   *exec.Cmd
	dir   string // removed at stop: the server that made it owns it
	pgDir string // the data directory whose private PostgreSQL it uses ("" for --url)
	done  chan error
}

// findHerald locates the herald binary.
func findHerald(flagValue string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "herald")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath("herald"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no herald binary next to herald-bench or in PATH: build one (make bench does) or pass --herald or --url")
}

// startServer runs `herald serve` on a free loopback port with a private
// PostgreSQL in a temporary directory.
func startServer(ctx context.Context, cfg benchConfig, log io.Writer, extra ...string) (*server, error) {
	dir, err := os.MkdirTemp("", "herald-bench-")
	if err != nil {
		return nil, err
	}
	// The postgres user runs the private cluster when we are root.
	_ = os.Chmod(dir, 0o777) // #nosec G302 -- a throwaway directory the postgres user must enter
	s, err := startIn(ctx, cfg, log, dir, cfg.Wake, extra...)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s.dir = dir
	return s, nil
}

// startIn runs `herald serve` with the private PostgreSQL of dir: the first
// instance on a dir starts it, later ones share it.
func startIn(ctx context.Context, cfg benchConfig, log io.Writer, dir, wake string, extra ...string) (*server, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return startAt(ctx, cfg, log, dir, addr, wake, extra...)
}

// startAt runs `herald serve` on addr with the private PostgreSQL of dir.
func startAt(ctx context.Context, cfg benchConfig, log io.Writer, dir, addr, wake string, extra ...string) (*server, error) {
	bin, err := findHerald(cfg.Herald)
	if err != nil {
		return nil, err
	}
	args := append([]string{"serve", "--addr", addr, "--data-dir", dir, "--log-level", "warn", "--wake", wake,
		"--ws-max-connections", strconv.Itoa(cfg.IdleWS + 100), "--sse-max-connections", strconv.Itoa(max(cfg.IdleSSE, cfg.fanoutMax()) + 100),
		"--drain-window", "0s"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	progress(log, "starting %s serve --addr %s --wake %s %s (private PostgreSQL in %s)", bin, addr, wake,
		strings.Join(extra, " "), dir)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{url: "http://" + addr, pid: cmd.Process.Pid, cmd: cmd, pgDir: dir, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	deadline := time.After(2 * time.Minute)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-s.done:
			return nil, fmt.Errorf("herald exited while starting: %v", err)
		case <-deadline:
			s.stop()
			return nil, fmt.Errorf("herald did not become healthy in 2 minutes")
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-tick.C:
			if res, err := http.Get(s.url + "/health"); err == nil {
				_ = res.Body.Close()
				if res.StatusCode == http.StatusOK {
					return s, nil
				}
			}
		}
	}
}

func (s *server) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.done:
		_ = err // a signalled exit is expected
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		err := <-s.done
		_ = err
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

// rss is the server's resident memory in bytes (0 when unknown).
func (s *server) rss() int64 {
	if s.pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		var kb int64
		if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	return 0
}

// cpu is the server's user+system CPU time so far.
func (s *server) cpu() time.Duration {
	if s.pid == 0 {
		return 0
	}
	f := fanoutload.ProcStat(s.pid)
	if len(f) < 13 {
		return 0
	}
	return ticks(f[11]) + ticks(f[12])
}

// pgCPU is the CPU time of the server's private PostgreSQL so far: the
// postmaster's own and its reaped children's (every backend that ended),
// plus its live children's. ok is false when it is not known (--url).
func (s *server) pgCPU() (d time.Duration, ok bool) {
	pm := s.postmaster()
	if pm == 0 {
		return 0, false
	}
	return treeCPU(pm), true
}

// postmasterFile is the server's private PostgreSQL's postmaster.pid, by
// line, or nil when it is not known (--url).
func (s *server) postmasterFile() []string {
	if s.pgDir == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(s.pgDir, "postgres", "pgdata", "postmaster.pid"))
	if err != nil {
		return nil
	}
	return strings.Split(string(b), "\n")
}

// postmaster is the process id of the server's private PostgreSQL, or 0.
func (s *server) postmaster() int {
	lines := s.postmasterFile()
	if len(lines) == 0 {
		return 0
	}
	pm, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil {
		return 0
	}
	return pm
}

// ownRoots are the processes whose trees are this benchmark's own: this
// process (the servers it starts descend from it), the private
// PostgreSQL's postmaster (which leaves its starter's tree) and a --url
// server's --pid.
func (s *server) ownRoots() []int {
	roots := []int{os.Getpid()}
	if pm := s.postmaster(); pm != 0 {
		roots = append(roots, pm)
	}
	if s.cmd == nil && s.pid > 0 {
		roots = append(roots, s.pid)
	}
	return roots
}

// treeCPU is the CPU time the processes descended from roots (the roots
// included) have spent so far: each live one's own, and what the children
// it reaped spent (cutime, cstime: a PostgreSQL backend that ended, a
// follower process of the fanout scenario). A process that ends between
// two readings moves from its own line to its parent's, so the difference
// of two readings stays right.
func treeCPU(roots ...int) time.Duration {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	parent := map[int]int{}
	spent := map[int]time.Duration{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f := fanoutload.ProcStat(pid)
		if len(f) < 15 {
			continue
		}
		parent[pid], _ = strconv.Atoi(f[1])
		spent[pid] = ticks(f[11]) + ticks(f[12]) + ticks(f[13]) + ticks(f[14]) // utime stime cutime cstime
	}
	in := map[int]bool{}
	for _, r := range roots {
		in[r] = true
	}
	var d time.Duration
	for pid, cpu := range spent {
		// Walk up to a root or past init (whose parent is 0), which may
		// be one (herald-bench as a container's first process); the
		// chain is short.
		for p, hops := pid, 0; p > 0 && hops < 64; p, hops = parent[p], hops+1 {
			if in[p] {
				d += cpu
				break
			}
		}
	}
	return d
}

// ticks reads a /proc clock-tick count as a duration.
// machineCPU is the time all of the machine's cores spent busy, and in
// all (idle included), so far: /proc/stat's first line; both 0 when it
// cannot be read. Busy over all between two readings is how loaded the
// machine was, whatever ran on it: the servers, this benchmark or a
// neighbour.
func machineCPU() (busy, all time.Duration) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0
	}
	// user nice system idle iowait irq softirq steal (guest time is
	// already in user).
	for i, v := range f[1:9] {
		d := ticks(v)
		all += d
		if i != 3 && i != 4 {
			busy += d
		}
	}
	return busy, all
}

func ticks(field string) time.Duration {
	n, _ := strconv.ParseInt(field, 10, 64)
	return time.Duration(n) * time.Second / 100 // USER_HZ
}

// metric sums a Prometheus counter or gauge (all label sets) from the
// server's /metrics.
func (s *server) metric(name string) (float64, error) {
	return benchstat.Metric(http.DefaultClient, s.url, name)
}

// pgDSN is a connection string to the server's private PostgreSQL (its
// socket directory and port, from postmaster.pid; the database Herald
// migrated, where the push SQL function is), or "" when it is not known
// (--url).
func (s *server) pgDSN() string {
	lines := s.postmasterFile()
	if len(lines) < 5 {
		return ""
	}
	return fmt.Sprintf("host=%s port=%s user=postgres dbname=herald", strings.TrimSpace(lines[4]), strings.TrimSpace(lines[3]))
}
