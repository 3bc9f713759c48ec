package pgcluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// pidFile is what postgres records in pgdata/postmaster.pid while it runs.
type pidFile struct {
	pid  int // line 1
	port int // line 4
}

// readPIDFile parses pgdata/postmaster.pid. A missing file yields
// fs.ErrNotExist; a file that is unparsable (e.g. truncated by a crash) is
// reported as an error so the caller can treat it as stale.
func readPIDFile(pgdata string) (pidFile, error) {
	b, err := os.ReadFile(filepath.Join(pgdata, "postmaster.pid"))
	if err != nil {
		return pidFile{}, err
	}
	lines := strings.Split(string(b), "\n")
	var pf pidFile
	if len(lines) > 0 {
		pf.pid, _ = strconv.Atoi(strings.TrimSpace(lines[0]))
	}
	if len(lines) > 3 {
		pf.port, _ = strconv.Atoi(strings.TrimSpace(lines[3]))
	}
	if pf.pid <= 0 {
		return pf, fmt.Errorf("parsing %s: no PID on line 1", filepath.Join(pgdata, "postmaster.pid"))
	}
	return pf, nil
}

// servesDir reports whether pid is a live postgres process working in pgdata
// (which must be a resolved, absolute path), or may be: see probeProcess.
func servesDir(pid int, pgdata string) bool {
	return probeProcess(pid, pgdata) != gone
}

// presence is what a look at a process found.
type presence int

const (
	gone    presence = iota // no postgres process working in the data directory
	serving                 // a postgres process working in it
	unsure                  // the look failed for want of file descriptors
)

// probeProcess looks at pid in /proc: a live postgres process working in
// pgdata (a resolved, absolute path) is serving.
//
// The postmaster and all its children chdir into the data directory, so this
// tells our postmaster apart from an unrelated process that inherited its PID
// after a crash, and from a postgres serving some other cluster; the name
// check keeps a shell that was cd'd into pgdata from blocking a start.
// Zombies have no cwd link and so count as gone, which is what we want: a
// killed postmaster may linger as a zombie when PID 1 does not reap.
// Processes of other users cannot be inspected unless we are root and count
// as gone too.
//
// The cwd link is read with readlink, which opens no descriptor and so
// works when this process has none left; the name is read from a file. A
// process whose cwd matches and whose name cannot be read for want of
// descriptors (EMFILE, ENFILE) counts as serving: the cwd is the test that
// matters, and out of descriptors nothing says it died.
func probeProcess(pid int, pgdata string) presence {
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	switch {
	case fdExhausted(err):
		return unsure
	case err != nil || cwd != pgdata:
		return gone
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	switch {
	case fdExhausted(err):
		return serving
	case err == nil && strings.TrimSpace(string(comm)) == "postgres":
		return serving
	}
	return gone
}

// fdExhausted reports whether err says that this process (EMFILE) or the
// system (ENFILE) has no file descriptor left. Such an error tells nothing
// about what was being looked at: it must never be read as "postgres is
// down" (or as any other state of the thing probed).
func fdExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// procsIn lists processes working in pgdata. After the postmaster is killed its
// children live on for a moment, still attached to the old shared memory;
// starting a new postmaster before they exit would fail or, worse, let two
// sets of processes touch the same files.
func procsIn(pgdata string) []int {
	entries, _ := os.ReadDir("/proc") // without /proc there is nothing to find
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && servesDir(pid, pgdata) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// owner is the OS identity postgres runs as. It is nil when we are not root:
// then postgres runs as ourselves and nothing needs chowning.
type owner struct {
	cred *syscall.Credential
}

// lookupOwner returns the postgres OS user when running as root, because
// initdb and postgres refuse to run as root.
func lookupOwner() (*owner, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("looking up the postgres OS user (needed because postgres refuses to run as root; `apt-get install -y postgresql` creates it): %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parsing uid of postgres user: %w", err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parsing gid of postgres user: %w", err)
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	ids, _ := u.GroupIds() // without supplementary groups the primary one still applies
	for _, id := range ids {
		if g, err := strconv.ParseUint(id, 10, 32); err == nil {
			cred.Groups = append(cred.Groups, uint32(g))
		}
	}
	return &owner{cred: cred}, nil
}

// checkTraversable returns an error naming the first directory from dir up to
// / that the owner cannot search. Without this, initdb fails later with a
// bare "Permission denied" that does not say which directory to fix.
// It reads mode bits only; ACLs are not considered.
func (o *owner) checkTraversable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("checking access to %s: %w", d, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok && !o.canSearch(fi.Mode().Perm(), st.Uid, st.Gid) {
			return fmt.Errorf("directory %s is not traversable by the postgres OS user (uid %d): "+
				"run `chmod o+x %s` or choose a directory postgres can reach", d, o.cred.Uid, d)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// canSearch applies the kernel's owner/group/other rule for the x bit.
func (o *owner) canSearch(perm fs.FileMode, uid, gid uint32) bool {
	switch {
	case uid == o.cred.Uid:
		return perm&0o100 != 0
	case gid == o.cred.Gid || slices.Contains(o.cred.Groups, gid):
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// chownTree hands dir and everything below it to the owner, so a directory
// prepared by root (or a data dir copied around by root) is usable by postgres.
func (o *owner) chownTree(dir string) error {
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // a running postgres may delete temp files under our feet
		}
		if err != nil {
			return err
		}
		if err := os.Lchown(p, int(o.cred.Uid), int(o.cred.Gid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("handing %s to the postgres OS user: %w", dir, err)
	}
	return nil
}
