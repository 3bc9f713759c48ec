package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/internal/pgcluster"
	"github.com/heraldmq/herald/internal/pgtest"
)

// exitCode runs cmd to its end and returns its exit status and stderr.
func exitCode(t *testing.T, cmd *exec.Cmd) (int, string) {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), stderr.String()
	}
	require.NoError(t, err)
	return 0, stderr.String()
}

// A port in use was found after initdb, a PostgreSQL start and migrations
// (1–6 s, and ./.herald created): serve and demo now bind first, and say
// how to choose another.
func TestCLI_PortInUseFailsBeforePostgres(t *testing.T) {
	bin := buildHerald(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = taken.Close() }()
	addr := taken.Addr().String()

	dir := filepath.Join(dataDir(t), "fresh")
	start := time.Now()
	code, stderr := exitCode(t, exec.Command(bin, "serve", "--addr", addr, "--data-dir", dir))
	took := time.Since(start)
	t.Logf("%v: %s", took, stderr)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, addr+" is already in use")
	assert.Contains(t, stderr, "--addr", "the message names the fix")
	assert.NoDirExists(t, dir, "no private PostgreSQL was made")
	assert.Less(t, took, 5*time.Second)

	// The demo: one of its HTTP ports taken, then one of its UDP ports.
	_, port, _ := net.SplitHostPort(addr)
	code, stderr = exitCode(t, exec.Command(bin, "demo", "--data-dir", dir, "--ports", port+",1,2"))
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "already in use")
	assert.Contains(t, stderr, "--ports 6640,6641,6642")
	assert.NoDirExists(t, dir)
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = udp.Close() }()
	_, uport, _ := net.SplitHostPort(udp.LocalAddr().String())
	free := []string{}
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		_, p, _ := net.SplitHostPort(ln.Addr().String())
		free = append(free, p)
		require.NoError(t, ln.Close())
	}
	code, stderr = exitCode(t, exec.Command(bin, "demo", "--data-dir", dir, "--ports", strings.Join(free, ","),
		"--sync-ports", uport+",1,2"))
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "(UDP) is already in use")
	assert.NoDirExists(t, dir)
}

// fakeInitdb puts an initdb that runs script (sh) ahead of the real
// PostgreSQL binaries on PATH, and returns the environment to run herald
// with.
func fakeInitdb(t *testing.T, script string) []string {
	t.Helper()
	bin, err := pgcluster.BinDir()
	require.NoError(t, err)
	dir := dataDir(t)                                                                                        // the postgres user must reach it
	require.NoError(t, os.WriteFile(filepath.Join(dir, "initdb"), []byte("#!/bin/sh\n"+script+"\n"), 0o755)) // #nosec G306 -- an executable
	for _, name := range []string{"pg_ctl", "postgres"} {
		require.NoError(t, os.Symlink(filepath.Join(bin, name), filepath.Join(dir, name)))
	}
	return append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"))
}

// A failing initdb put its ~900-character transcript into one log line:
// it now goes to a file the error names.
func TestCLI_InitdbTranscriptGoesToAFile(t *testing.T) {
	bin := buildHerald(t)
	transcript := strings.Repeat("initdb says something long. ", 60)
	env := fakeInitdb(t, fmt.Sprintf("echo %q; echo 'initdb: error: it went wrong' >&2; exit 1", transcript))
	dir := dataDir(t)
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--data-dir", dir)
	cmd.Env = env
	code, stderr := exitCode(t, cmd)
	assert.Equal(t, 1, code)
	var last struct{ Level, Error, Message string }
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &last), stderr)
	assert.Equal(t, "error", last.Level)
	assert.NotContains(t, last.Error, "initdb says something long", "the transcript is not in the log")
	logPath := filepath.Join(dir, "postgres", "initdb.log")
	assert.Contains(t, last.Error, logPath, "the error names the file")
	b, err := os.ReadFile(logPath) // #nosec G304 -- the test's own directory
	require.NoError(t, err)
	assert.Contains(t, string(b), "initdb: error: it went wrong")
	assert.Contains(t, string(b), "initdb says something long")
}

// Ctrl-C was an error (exit 1, "ERR herald stopped error=... context
// canceled"), also while initdb ran: a stop asked for by a signal exits 0
// with one "herald stopped" line at info, at any stage.
func TestCLI_SignalsExitZero(t *testing.T) {
	bin := buildHerald(t)

	t.Run("during initdb", func(t *testing.T) {
		env := fakeInitdb(t, "echo started; exec sleep 60")
		dir := dataDir(t)
		cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--data-dir", dir)
		cmd.Env = env
		stderr, err := cmd.StderrPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		sc := bufio.NewScanner(stderr)
		var lines []string
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if strings.Contains(sc.Text(), "initializing postgres cluster") {
				break
			}
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
		rest, _ := io.ReadAll(stderr)
		lines = append(lines, strings.Split(strings.TrimSpace(string(rest)), "\n")...)
		require.NoError(t, cmd.Wait(), "exit 0: %s", strings.Join(lines, "\n"))
		assertOneStoppedLine(t, lines)
	})

	t.Run("serving", func(t *testing.T) {
		for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
			p := startHerald(t, bin, dataDir(t), "--database-url", pgtest.DSN(t))
			require.NoError(t, p.stop(t, sig), "%v exits 0", sig)
		}
	})
}

func assertOneStoppedLine(t *testing.T, lines []string) {
	t.Helper()
	stopped := 0
	for _, l := range lines {
		var line struct{ Level, Message string }
		if json.Unmarshal([]byte(l), &line) != nil {
			continue
		}
		assert.NotEqual(t, "error", line.Level, l)
		if line.Message == "herald stopped" {
			stopped++
			assert.Equal(t, "info", line.Level, l)
		}
	}
	assert.Equal(t, 1, stopped, "%s", strings.Join(lines, "\n"))
}

// openPty opens a pseudo-terminal pair: what is written to its terminal
// side (pts) is read from ptmx.
func openPty(t *testing.T) (ptmx, pts *os.File) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ptmx.Close() })
	var unlock int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, ptmx.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))) // #nosec G103 -- ioctl argument
	require.Zero(t, errno)
	var n uint32
	_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, ptmx.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))) // #nosec G103 -- ioctl argument
	require.Zero(t, errno)
	pts, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pts.Close() })
	return ptmx, pts
}

// Logs were JSON even for a person at a terminal: auto (the default) picks
// console lines on a terminal and JSON anywhere else; the flag wins.
func TestCLI_LogFormatFollowsTheTerminal(t *testing.T) {
	cfg, err := parseConfig("serve", nil, func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "auto", cfg.LogFormat)

	ptmx, pts := openPty(t)
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer func() { _ = devnull.Close() }()
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	defer func() { _ = pr.Close(); _ = pw.Close() }()
	assert.True(t, isTerminal(pts), "a pseudo-terminal")
	assert.False(t, isTerminal(devnull), "/dev/null is a character device, not a terminal")
	assert.False(t, isTerminal(pw), "a pipe")
	assert.False(t, isTerminal(&bytes.Buffer{}))

	logged := func(format string, w io.Writer) {
		c := *cfg
		c.LogFormat = format
		log := newLogger(&c, w)
		log.Info().Str("url", "http://localhost:6632/").Msg("herald is serving")
	}
	var buf bytes.Buffer
	logged("auto", &buf)
	assert.True(t, json.Valid(buf.Bytes()), "auto off a terminal: JSON, %q", buf.String())
	buf.Reset()
	logged("console", &buf)
	assert.False(t, json.Valid(buf.Bytes()), "console wins: %q", buf.String())

	// On a terminal: a console line.
	lines := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(ptmx).ReadString('\n')
		lines <- l
	}()
	logged("auto", pts)
	select {
	case l := <-lines:
		t.Logf("%q", l)
		assert.Contains(t, l, "herald is serving")
		assert.Contains(t, l, "url=")
		assert.Contains(t, l, "http://localhost:6632/")
		assert.False(t, strings.HasPrefix(strings.TrimSpace(l), "{"), "not JSON on a terminal")
	case <-time.After(10 * time.Second):
		t.Fatal("nothing reached the terminal")
	}
	buf.Reset()
	c := *cfg
	c.LogFormat = "json"
	log := newLogger(&c, &buf)
	log.Info().Msg("x")
	assert.True(t, json.Valid(buf.Bytes()), "json wins")
}

// Database errors carried pgx's first attempt, "tls error: server refused
// TLS connection", ahead of the real cause.
func TestCLI_DatabaseErrorsWithoutTLSNoise(t *testing.T) {
	cfg, err := pgx.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	url := fmt.Sprintf("postgres://%s@%s:%d/no_such_database", cfg.User, cfg.Host, cfg.Port) // sslmode prefer: TLS first
	_, err = pgx.Connect(t.Context(), url)
	require.Error(t, err)
	require.Contains(t, err.Error(), "server refused TLS connection", "the raw error has the noise")
	plain := plainError(fmt.Errorf("connecting to database: %w", err)).(string)
	t.Log(plain)
	assert.NotContains(t, plain, "TLS")
	assert.Contains(t, plain, `database "no_such_database" does not exist`)
	assert.NotContains(t, plain, "\n", "one attempt left: one line")
}

// A mysql:// URL got "cannot parse" without saying what is expected.
func TestCLI_BadURLSchemeIsNamed(t *testing.T) {
	for _, flag := range []string{"--database-url", "--listen-database-url"} {
		_, err := parseConfig("serve", []string{flag, "mysql://u:secret@h/db"}, func(string) string { return "" }, io.Discard)
		require.Error(t, err)
		assert.Contains(t, err.Error(), flag)
		assert.Contains(t, err.Error(), "postgres://")
		assert.Contains(t, err.Error(), "mysql://")
		assert.NotContains(t, err.Error(), "secret", "no password in the message")
	}
	for _, ok := range []string{"postgres://u@h/db", "postgresql://u@h/db", "host=h dbname=db"} {
		_, err := parseConfig("serve", []string{"--database-url", ok}, func(string) string { return "" }, io.Discard)
		assert.NoError(t, err, ok)
	}
}

// herald --version was unknown; --help's columns broke on long flag names.
func TestCLI_VersionAndHelp(t *testing.T) {
	for _, arg := range []string{"--version", "-v", "version"} {
		var out, errOut bytes.Buffer
		assert.Equal(t, 0, run([]string{arg}, &out, &errOut), arg)
		assert.True(t, strings.HasPrefix(out.String(), "herald "), "%s: %q", arg, out.String())
	}
	var out bytes.Buffer
	usage(&out, "serve")
	envCol, helpCol := -1, -1
	flags := 0
	for _, l := range strings.Split(out.String(), "\n") {
		assert.LessOrEqual(t, len(l), helpWidth, "line too long: %q", l)
		if !strings.HasPrefix(l, "  --") {
			continue
		}
		flags++
		env := strings.Index(l, "HERALD_")
		require.Positive(t, env, l)
		rest := l[env:]
		help := env + strings.Index(rest, " ") + strings.IndexFunc(rest[strings.Index(rest, " "):], func(r rune) bool { return r != ' ' })
		if envCol < 0 {
			envCol, helpCol = env, help
		}
		assert.Equal(t, envCol, env, "environment column: %q", l)
		assert.Equal(t, helpCol, help, "meaning column: %q", l)
	}
	assert.Equal(t, len(options), flags, "one line per flag")
}
