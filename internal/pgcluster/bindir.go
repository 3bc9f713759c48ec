package pgcluster

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// errNoBinaries is what BinDir reports when no server installation is found.
// It names the fix because the usual reader is someone running
// `herald serve` or `go test` on a fresh machine.
var errNoBinaries = errors.New("PostgreSQL server binaries (initdb, pg_ctl, postgres) are missing: " +
	"not on PATH, not at `pg_config --bindir`, not in /usr/lib/postgresql/*/bin; " +
	"install them with `apt-get install -y postgresql` (Debian/Ubuntu) or point PATH at their bin directory")

// debianBinGlob is where Debian keeps server binaries; a variable so the
// "missing binaries" path can be tested on a machine that has them.
var debianBinGlob = "/usr/lib/postgresql/*/bin"

// BinDir returns the directory holding initdb, pg_ctl and postgres.
//
// It looks on PATH first (so a developer can pick a version explicitly), then
// asks pg_config, then falls back to the newest Debian-style
// /usr/lib/postgresql/<version>/bin, because Debian keeps server binaries off
// PATH.
func BinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil && hasServer(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	// pg_config may come from a client-only package (libpq-dev), so its
	// answer is only trusted if the server binaries are really there.
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); hasServer(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob(debianBinGlob) // pattern is valid; error impossible
	slices.SortFunc(dirs, func(a, b string) int {
		return compareVersions(filepath.Base(filepath.Dir(b)), filepath.Base(filepath.Dir(a)))
	})
	for _, dir := range dirs {
		if hasServer(dir) {
			return dir, nil
		}
	}
	return "", errNoBinaries
}

// hasServer reports whether dir holds every binary Start runs.
func hasServer(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// compareVersions orders dotted versions numerically ("9.6" < "15"), which a
// plain string sort gets wrong.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}
