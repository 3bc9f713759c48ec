package pgcluster

import (
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
