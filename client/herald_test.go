package client_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The SDK is tested against a real Herald, yet this module must not require
// the server module (a consumer would resolve all of its requirements). So
// TestMain builds cmd/herald from the server module next door (`go build
// -C ..`) and runs it as a process: it starts a private PostgreSQL under
// its --data-dir. Tests that need a Herald of their own (auth on, a
// restart) start another one on the same directory, which shares that
// PostgreSQL (internal/pgcluster lets several processes use one cluster),
// so it is one more instance on the same database, as in production.

var (
	heraldBin string  // the binary TestMain built
	heraldDir string  // the --data-dir every Herald of this run shares
	shared    *herald // the Herald most tests and Example_readme talk to
)

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "herald-client-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "creating the test directory:", err)
		return 1
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	// As root, herald runs postgres as the postgres OS user, which must
	// traverse this directory (MkdirTemp makes it 0700).
	if err := os.Chmod(tmp, 0o755); err != nil { // #nosec G302 -- postgres must traverse it
		fmt.Fprintln(os.Stderr, "opening the test directory to postgres:", err)
		return 1
	}
	// The server's source is the module next door, in a checkout of the
	// repository; a copy of this module from the module proxy has none.
	mod, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil || !strings.HasPrefix(string(mod), "module github.com/heraldmq/herald\n") {
		fmt.Fprintln(os.Stderr, "the SDK's tests build cmd/herald from the server module in client/..: "+
			"run them in a checkout of github.com/heraldmq/herald")
		return 1
	}
	heraldBin, heraldDir = filepath.Join(tmp, "herald"), filepath.Join(tmp, "data")
	build := exec.Command("go", "build", "-C", "..", "-o", heraldBin, "./cmd/herald")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building herald from the server module (client/..): %v\n%s", err, out)
		return 1
	}
	if shared, err = startHerald(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	// Stopped before the leak check: the goroutine reading its log ends
	// with the process.
	if err := shared.stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the shared herald:", err)
		code = max(code, 1)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// herald is a `herald serve` process that can be stopped and started again
// on the same address.
type herald struct {
	args []string // serve flags after --addr and --data-dir
	addr string   // 127.0.0.1:port; port 0 until the first start picked one

	mu   sync.Mutex
	log  []string // the last lines of its log, for a failure message
	cmd  *exec.Cmd
	done chan error // its exit, once
}

// logLines is how much of a herald's log a start failure shows.
const logLines = 40

// startHerald runs `herald serve` with the shared data directory, a free
// port and extra flags, and returns when it logs that it is serving.
func startHerald(extra ...string) (*herald, error) {
	h := &herald{addr: "127.0.0.1:0", args: append([]string{
		"--data-dir", heraldDir, "--log-format", "json",
		"--drain-window", "0s", // a stop closes connections at once: no reconnect storm to spread here
	}, extra...)}
	return h, h.start()
}

// newHerald is startHerald for a test: it stops the process when the test
// ends.
func newHerald(t *testing.T, extra ...string) *herald {
	t.Helper()
	h, err := startHerald(extra...)
	t.Cleanup(func() { _ = h.stop() })
	require.NoError(t, err)
	return h
}

func (h *herald) start() error {
	cmd := exec.Command(heraldBin, append([]string{"serve", "--addr", h.addr}, h.args...)...) // #nosec G204 -- the binary this test built
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("piping herald's log: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting herald: %w", err)
	}
	done := make(chan error, 1)
	h.mu.Lock()
	h.cmd, h.done, h.log = cmd, done, nil
	h.mu.Unlock()
	serving := make(chan string, 1)
	go h.read(stderr, serving, cmd, done)
	select {
	case u := <-serving:
		pu, err := url.Parse(u)
		if err != nil {
			_ = h.stop()
			return fmt.Errorf("parsing the URL herald logged (%q): %w", u, err)
		}
		h.addr = "127.0.0.1:" + pu.Port()
		return nil
	case err := <-done:
		done <- err // for stop
		return fmt.Errorf("herald exited before serving (%v); its log:\n%s", err, h.tail())
	case <-time.After(2 * time.Minute):
		_ = h.stop()
		return fmt.Errorf("herald did not serve within 2 minutes; its log:\n%s", h.tail())
	}
}

// read keeps the tail of the log, sends the URL of the "herald is serving"
// line, and reports the exit once the log ends.
func (h *herald) read(stderr io.Reader, serving chan<- string, cmd *exec.Cmd, done chan<- error) {
	sc := bufio.NewScanner(stderr)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		h.mu.Lock()
		h.log = append(h.log, sc.Text())
		if len(h.log) > logLines {
			h.log = h.log[len(h.log)-logLines:]
		}
		h.mu.Unlock()
		var line struct{ Message, URL string }
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "herald is serving" {
			select {
			case serving <- line.URL:
			default:
			}
		}
	}
	_, _ = io.Copy(io.Discard, stderr)
	done <- cmd.Wait()
}

func (h *herald) tail() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.log, "\n")
}

// stop ends the process as an operator would (SIGTERM: it drains and gives
// leases back) and waits for it; stopping a stopped herald does nothing.
func (h *herald) stop() error {
	h.mu.Lock()
	cmd, done := h.cmd, h.done
	h.cmd = nil
	h.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling herald: %w", err)
	}
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("herald exited with %w; its log:\n%s", err, h.tail())
		}
		return nil
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		return fmt.Errorf("herald did not stop within a minute; its log:\n%s", h.tail())
	}
}

func (h *herald) url() string { return "http://" + h.addr }

// signToken asks `herald token` for a token signed with secret, as an
// operator would for development.
func signToken(t *testing.T, secret, sub, role string, ttl time.Duration) string {
	t.Helper()
	tok, err := heraldToken(ctxT(t), secret, sub, role, ttl)
	require.NoError(t, err)
	return tok
}

// heraldToken is signToken for a goroutine that must not stop the test (a
// TokenSource).
func heraldToken(ctx context.Context, secret, sub, role string, ttl time.Duration) (string, error) {
	out, err := exec.CommandContext(ctx, heraldBin, "token", "--secret", secret, "--sub", sub, "--role", role, // #nosec G204 -- the binary this test built
		"--ttl", ttl.String()).Output()
	if err != nil {
		return "", fmt.Errorf("running herald token: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func (h *herald) post(t *testing.T, path, body string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, h.url()+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
}

// get decodes the JSON answer to a GET of path into v.
func (h *herald) get(t *testing.T, path string, v any) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet, h.url()+path, nil)
	require.NoError(t, err)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, "%s", b)
	require.NoError(t, json.Unmarshal(b, v), "%s", b)
}

// groupPositions reads each consumer group's cursor and lag on the
// partitions of queue (GET /api/v1/resources/partitions), summed over
// them: what the store's consumer rows say, through the API.
func (h *herald) groupPositions(t *testing.T, queue string) map[string]position {
	t.Helper()
	var page struct {
		Partitions []struct {
			Groups []struct {
				Name   string `json:"name"`
				Cursor int    `json:"cursor"`
				Lag    int    `json:"lag"`
			} `json:"groups"`
		} `json:"partitions"`
	}
	h.get(t, "/api/v1/resources/partitions?queue="+url.QueryEscape(queue)+"&limit=1000", &page)
	out := map[string]position{}
	for _, p := range page.Partitions {
		for _, g := range p.Groups {
			pos := out[g.Name]
			pos.Cursor += g.Cursor
			pos.Lag += g.Lag
			out[g.Name] = pos
		}
	}
	return out
}

// position is a consumer group's place on a queue.
type position struct{ Cursor, Lag int }

// deadLetters counts the dead letters of queue.
func (h *herald) deadLetters(t *testing.T, queue string) int {
	t.Helper()
	var dlq struct {
		Total int `json:"total"`
	}
	h.get(t, "/api/v1/dlq?queue="+url.QueryEscape(queue), &dlq)
	return dlq.Total
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
