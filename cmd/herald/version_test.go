package main

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// herald --version names the module version and the commit the binary was
// built from, as the toolchain recorded them (runtime/debug.ReadBuildInfo),
// and says so when the build recorded no commit; -ldflags -X main.version
// (the Dockerfile's) names the version but keeps the commit.
func TestBuildVersion_ReportsModuleVersionAndCommit(t *testing.T) {
	rev := "40638d53c46cdce4bffbcd2163d98b587696875f"
	info := func(v string, settings ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/heraldmq/herald", Version: v}}
		for i := 0; i+1 < len(settings); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return bi
	}
	for _, tc := range []struct {
		ld   string
		bi   *debug.BuildInfo
		want string
	}{
		{bi: info("v0.4.0", "vcs.revision", rev, "vcs.modified", "false"), want: "v0.4.0 (commit 40638d53c46c)"},
		{bi: info("v0.0.0-20261127073000-40638d53c46c+dirty", "vcs", "git", "vcs.revision", rev, "vcs.modified", "true"),
			want: "v0.0.0-20261127073000-40638d53c46c+dirty (commit 40638d53c46c, modified)"},
		{bi: info("(devel)"), want: "(devel) (no VCS revision recorded)"},
		{ld: "1.2.3", bi: info("(devel)", "vcs.revision", rev), want: "1.2.3 (commit 40638d53c46c)"},
		{bi: nil, want: "(devel) (no VCS revision recorded)"},
	} {
		assert.Equal(t, tc.want, describeBuild(tc.ld, tc.bi))
	}

	// This test binary's own build: what `herald version` prints is what
	// the toolchain recorded for it, never a made-up "dev".
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"--version"}, &out, &errOut))
	bi, ok := debug.ReadBuildInfo()
	require.True(t, ok)
	assert.Equal(t, "herald "+describeBuild("", bi)+"\n", out.String())
	assert.NotEqual(t, "herald dev\n", out.String())
}

// herald demo and herald produce log console lines: coloured on a
// terminal, plain text (no escape codes) into a file or a pipe. The same
// holds for herald serve with --log-format console.
func TestToolLogger_ColoursOnlyOnATerminal(t *testing.T) {
	const esc = "\x1b["
	var buf bytes.Buffer
	l := toolLogger(&buf)
	l.Info().Str("k", "v").Msg("demo producer running")
	assert.Contains(t, buf.String(), "demo producer running")
	assert.NotContains(t, buf.String(), esc, "a buffer is not a terminal")

	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	l = toolLogger(f)
	l.Warn().Msg("into a file")
	cfg := &config{LogLevel: "info", LogFormat: "console"}
	sl := newLogger(cfg, f)
	sl.Info().Msg("serve, console format, into a file")
	b, err := os.ReadFile(f.Name())
	require.NoError(t, err)
	assert.Contains(t, string(b), "into a file")
	assert.Contains(t, string(b), "serve, console format")
	assert.NotContains(t, string(b), esc, "a file is not a terminal")

	// A terminal (a pseudo-terminal's far side) gets colours.
	pty := openPTY(t)
	l = toolLogger(pty.tty)
	l.Info().Msg("on a terminal")
	got := pty.read(t, "on a terminal")
	assert.True(t, strings.Contains(got, esc), "a terminal gets colours: %q", got)
}
