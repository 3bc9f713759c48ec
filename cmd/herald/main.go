package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/heraldmq/herald/internal/server"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && slices.Contains([]string{"--version", "-version", "-v", "-V"}, args[0]) {
		args[0] = "version"
	}
	cmd := "serve"
	if len(args) > 0 && slices.Contains([]string{"serve", "migrate", "version", "help", "demo", "produce", "health", "token"}, args[0]) {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "version":
		fmt.Fprintln(stdout, "herald", buildVersion())
		return 0
	case "help":
		usage(stdout, "serve")
		return 0
	case "token":
		switch err := runToken(args, stdout, stderr); {
		case errors.Is(err, flag.ErrHelp):
			return 0
		case err != nil:
			fmt.Fprintln(stderr, "herald token:", err)
			return 2
		}
		return 0
	case "demo", "produce", "health":
		return runTool(cmd, args, stdout, stderr)
	}
	cfg, err := parseConfig(cmd, args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "herald:", err)
		return 2
	}
	zerolog.ErrorMarshalFunc = plainError
	log := newLogger(cfg, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = serve(ctx, cmd, cfg, log)
	switch {
	case ctx.Err() != nil:
		// SIGINT or SIGTERM: a stop the operator asked for, at any stage
		// (an initdb or a migration it interrupted included).
		ev := log.Info()
		if err != nil && !errors.Is(err, context.Canceled) {
			ev = log.Warn().Err(err)
		}
		ev.Msg("herald stopped")
		return 0
	case err != nil:
		log.Error().Err(err).Msg("herald stopped")
		return 1
	}
	return 0
}

// runTool runs the demo topology, the demo producer or a health check.
func runTool(cmd string, args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := toolLogger(stderr)
	var err error
	switch cmd {
	case "demo":
		var c *demoConfig
		if c, err = parseDemo(args, stderr); err == nil {
			err = demo(ctx, c, stdout, log)
		}
	case "produce":
		err = runProduce(ctx, args, stderr, log)
	case "health":
		err = runHealth(ctx, args, stderr)
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case ctx.Err() != nil:
		fmt.Fprintf(stderr, "herald %s: stopped\n", cmd) // SIGINT or SIGTERM, at any stage
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "herald %s: %v\n", cmd, plainError(err))
		return 1
	}
	return 0
}

func newLogger(cfg *config, w io.Writer) zerolog.Logger {
	lvl, _ := zerolog.ParseLevel(cfg.LogLevel)
	if cfg.LogFormat == "console" || (cfg.LogFormat == "auto" && isTerminal(w)) {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: !isTerminal(w)}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger()
}

// toolLogger is the logger of herald demo and herald produce: console
// lines, coloured only when w is a terminal (a redirected log gets plain
// text, no escape codes).
func toolLogger(w io.Writer) zerolog.Logger {
	cw := zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: !isTerminal(w)}
	return zerolog.New(cw).With().Timestamp().Logger()
}

// plainError is an error as Herald logs it. A connection error from pgx
// lists every attempt; with sslmode=prefer (a URL that names no sslmode)
// the first is "tls error: server refused TLS connection", which says only
// that the server does not do TLS and hides the real cause in the next
// line: that attempt is dropped, and a single remaining one joins its line.
func plainError(err error) any {
	if err == nil {
		return nil
	}
	lines := strings.Split(err.Error(), "\n")
	kept := lines[:0:0]
	for _, l := range lines {
		if len(lines) > 2 && strings.Contains(l, "server refused TLS connection") {
			continue
		}
		kept = append(kept, l)
	}
	if len(kept) == 2 && strings.HasPrefix(kept[1], "\t") {
		return kept[0] + " " + strings.TrimSpace(kept[1])
	}
	return strings.Join(kept, "\n")
}

// isTerminal reports whether w is a person's terminal, as opposed to a file,
// a pipe, /dev/null or a log collector.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && terminal(f)
}

// buildVersion is what `herald version`, /health and the logs report: the
// version set with -ldflags "-X main.version=…" or else the module's, and
// the commit it was built from, as the Go toolchain recorded them.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return describeBuild(version, bi)
}

// describeBuild renders a build's version: ldVersion when set, else the
// main module's version (a release tag with go install …@vX, a
// pseudo-version, or "(devel)"), then the VCS revision (12 characters,
// "modified" when the tree had uncommitted changes) or a note that the
// build recorded none (built outside a git checkout, in a git worktree, or
// with -buildvcs=false).
func describeBuild(ldVersion string, bi *debug.BuildInfo) string {
	v := ldVersion
	if v == "" && bi != nil {
		v = bi.Main.Version
	}
	if v == "" {
		v = "(devel)"
	}
	var rev, modified string
	if bi != nil {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
	}
	if rev == "" {
		return v + " (no VCS revision recorded)"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		return v + " (commit " + rev + ", modified)"
	}
	return v + " (commit " + rev + ")"
}

// serve runs one instance until ctx ends; migrate only applies the
// migrations. Ports are checked first: a port in use is reported in a
// moment, before a private PostgreSQL is initialized, started and migrated
// for nothing.
func serve(ctx context.Context, cmd string, cfg *config, log zerolog.Logger) (err error) {
	sc := cfg.Config
	sc.Logger, sc.Version = log, buildVersion()
	if cmd == "migrate" {
		return server.Migrate(ctx, sc)
	}
	if sc.Listener == nil {
		if sc.Listener, err = listen(cfg.Addr, "--addr", "HERALD_ADDR"); err != nil {
			return err
		}
	}
	defer func() { _ = sc.Listener.Close() }() // the server closes it too
	if cfg.SyncOn() {
		if err := probeUDP(cfg.SyncBind); err != nil {
			return bindError(cfg.SyncBind, "--sync-bind", "HERALD_SYNC_BIND", err)
		}
	}
	if cfg.PprofAddr != "" {
		stopPprof, err := servePprof(cfg.PprofAddr, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}
	srv, err := server.New(ctx, sc)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}
