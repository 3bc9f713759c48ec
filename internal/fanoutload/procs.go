package fanoutload

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Procs are the running children of one measurement: processes of the
// benchmark's own binary that hold connections for it, each reading its
// stdin and answering in lines on its stdout.
type Procs struct {
	procs []*child
}

type child struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// StartChildren starts one child per element of args: the command is argv
// (this binary and its child subcommand) followed by that element, its
// stderr goes to log. It returns once every child has said "ready" as its
// first line on stdout; a child that says anything else (its "error: …")
// or ends first fails the start, and the children started are closed.
// The followers' children (StartFollowers) and the idle benchmark's
// connection holders are started so.
func StartChildren(ctx context.Context, argv []string, args [][]string, log io.Writer) (*Procs, error) {
	fp := &Procs{}
	name := strings.Join(argv[1:], " ")
	errc := make(chan error, len(args))
	for _, a := range args {
		cmd := exec.CommandContext(ctx, argv[0], append(append([]string(nil), argv[1:]...), a...)...) // #nosec G204 -- our own binary
		cmd.Stderr = log
		in, err := cmd.StdinPipe()
		if err != nil {
			fp.Close()
			return nil, fmt.Errorf("piping to a child process (%s): %w", name, err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			fp.Close()
			return nil, fmt.Errorf("piping from a child process (%s): %w", name, err)
		}
		if err := cmd.Start(); err != nil {
			fp.Close()
			return nil, fmt.Errorf("starting a child process (%s): %w", name, err)
		}
		pr := &child{cmd: cmd, in: in, out: bufio.NewScanner(out)}
		pr.out.Buffer(make([]byte, 1<<20), 64<<20) // a follower's result line carries its histogram
		fp.procs = append(fp.procs, pr)
		go func() {
			if !pr.out.Scan() {
				errc <- fmt.Errorf("a child process (%s) ended before it was ready", name)
				return
			}
			if l := pr.out.Text(); l != "ready" {
				errc <- fmt.Errorf("child process (%s): %s", name, l)
				return
			}
			errc <- nil
		}()
	}
	for range args {
		if err := <-errc; err != nil {
			fp.Close()
			return nil, err
		}
	}
	return fp, nil
}

// CPU is the children's user+system CPU time so far (the load
// generator's side of the deliveries).
func (fp *Procs) CPU() time.Duration {
	var d time.Duration
	for _, p := range fp.procs {
		if f := ProcStat(p.cmd.Process.Pid); len(f) >= 13 {
			ut, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			d += time.Duration(ut+st) * time.Second / 100 // USER_HZ
		}
	}
	return d
}

// Close ends the children: it closes their stdin (each ends when it
// does) and waits for them.
func (fp *Procs) Close() {
	for _, p := range fp.procs {
		_ = p.in.Close()
	}
	for _, p := range fp.procs {
		_ = p.cmd.Wait()
	}
}
