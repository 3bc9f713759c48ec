package pgcluster

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSocketDir(t *testing.T) {
	assert.Equal(t, "/tmp/x", socketDir("/tmp/x"))
	assert.Empty(t, socketDir("/tmp/"+strings.Repeat("x", 100)), "socket path would exceed sun_path")
}

func TestPostgresOptions(t *testing.T) {
	opts := postgresOptions(5433, "", map[string]string{
		"port":             "1", // must not win over the port the URL uses
		"application_name": "it's",
		"wal_level":        "replica",
	})
	assert.Contains(t, opts, "-c 'port=5433'")
	assert.NotContains(t, opts, "port=1'")
	assert.Contains(t, opts, `-c 'application_name=it'\''s'`)
	assert.Contains(t, opts, "-c 'wal_level=replica'")
	assert.Contains(t, opts, "-c 'unix_socket_directories='")
}

func TestCompareVersions(t *testing.T) {
	assert.Negative(t, compareVersions("9.6", "15"))
	assert.Negative(t, compareVersions("15", "16"))
	assert.Zero(t, compareVersions("15", "15"))
}

func TestCheckTraversable(t *testing.T) {
	parent, err := os.MkdirTemp("", "pgcluster-perm-")
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, os.RemoveAll(parent)) })
	dir := filepath.Join(parent, "cluster")
	require.NoError(t, os.Mkdir(dir, 0o711))

	// Someone who is neither owner nor in the group, as postgres is for
	// directories root created.
	stranger := &owner{cred: &syscall.Credential{Uid: uint32(os.Getuid()) + 4242, Gid: uint32(os.Getgid()) + 4242}}
	require.NoError(t, os.Chmod(parent, 0o700))
	err = stranger.checkTraversable(dir)
	require.ErrorContains(t, err, "directory "+parent+" is not traversable")

	require.NoError(t, os.Chmod(parent, 0o711))
	require.NoError(t, stranger.checkTraversable(dir))
}

// Without server binaries anywhere, BinDir (and so Start and every test
// database) fails with a message that says what to install.
func TestBinDir_Missing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	old := debianBinGlob
	debianBinGlob = filepath.Join(t.TempDir(), "*", "bin")
	t.Cleanup(func() { debianBinGlob = old })
	_, err := BinDir()
	require.ErrorIs(t, err, errNoBinaries)
	assert.Contains(t, err.Error(), "apt-get install -y postgresql")
	_, err = Start(t.Context(), Config{Dir: t.TempDir()})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PostgreSQL server binaries")
}

// The supervisor's liveness rule: a look that failed for want of file
// descriptors (this process at its open-file limit) never makes the
// postmaster "down"; it is judged by its process alone, and a missing
// postmaster.pid, a dead process or another port still are down.
func TestSupervise_ProbeOutOfDescriptorsIsNotDown(t *testing.T) {
	emfile := &fs.PathError{Op: "open", Path: "pgdata/postmaster.pid", Err: syscall.EMFILE}
	enfile := &fs.PathError{Op: "open", Path: "pgdata/postmaster.pid", Err: syscall.ENFILE}
	missing := &fs.PathError{Op: "open", Path: "pgdata/postmaster.pid", Err: syscall.ENOENT}
	at := func(states map[int]presence) func(int) presence {
		return func(pid int) presence { return states[pid] } // unknown pids: gone
	}
	for _, tc := range []struct {
		name    string
		pf      pidFile
		readErr error
		last    int
		procs   map[int]presence
		down    bool
		pid     int
	}{
		{"EMFILE, the last postmaster runs", pidFile{}, emfile, 42, map[int]presence{42: serving}, false, 0},
		{"ENFILE, none seen yet", pidFile{}, enfile, 0, nil, false, 0},
		{"EMFILE, the process cannot be looked at either", pidFile{}, emfile, 42, map[int]presence{42: unsure}, false, 0},
		{"EMFILE, the last postmaster is gone", pidFile{}, emfile, 42, nil, true, 0},
		{"postmaster.pid missing", pidFile{}, missing, 42, map[int]presence{42: serving}, true, 0},
		{"serving", pidFile{pid: 7, port: 5432}, nil, 0, map[int]presence{7: serving}, false, 7},
		{"its name unreadable for want of descriptors", pidFile{pid: 7, port: 5432}, nil, 0, map[int]presence{7: unsure}, false, 7},
		{"gone", pidFile{pid: 7, port: 5432}, nil, 7, nil, true, 0},
		{"another port", pidFile{pid: 7, port: 5433}, nil, 7, map[int]presence{7: serving}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why, pid := judge(tc.pf, tc.readErr, 5432, tc.last, at(tc.procs))
			assert.Equal(t, tc.down, why != "", "why: %q", why)
			assert.Equal(t, tc.pid, pid)
		})
	}
	assert.True(t, fdExhausted(fmt.Errorf("opening start lock: %w", emfile)), "wrapped")
	assert.True(t, fdExhausted(enfile))
	assert.False(t, fdExhausted(missing))
	assert.False(t, fdExhausted(nil))
}

// A process whose cwd is the data directory is looked at without a
// descriptor: this test process, which works in a temp dir, is gone for
// another directory and for a dead pid.
func TestProbeProcess(t *testing.T) {
	wd, err := os.Getwd()
	require.NoError(t, err)
	wd, err = filepath.EvalSymlinks(wd)
	require.NoError(t, err)
	assert.Equal(t, gone, probeProcess(os.Getpid(), wd), "not named postgres")
	assert.Equal(t, gone, probeProcess(os.Getpid(), "/nonexistent"))
	assert.Equal(t, gone, probeProcess(1<<22+1, wd), "no such process")
}
