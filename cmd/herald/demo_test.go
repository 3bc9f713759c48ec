package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	return p
}

// `herald demo`: three healthy instances with syncnet on one private
// PostgreSQL and a producer; a message pushed on one reaches a subscriber on
// another; Ctrl-C stops everything, PostgreSQL included.
func TestDemo_ThreeInstances(t *testing.T) {
	bin := buildHerald(t)
	dir := dataDir(t)
	// The free ports are picked, then bound by herald: another test may take
	// one in between, so a start that finds its port taken is tried again.
	var (
		ports  []string
		cmd    *exec.Cmd
		stderr *bytes.Buffer
		exited chan error
		urls   []string
	)
	for attempt := 1; ; attempt++ {
		ports, cmd, stderr, exited, urls = startDemo(t, bin, dir)
		if urls != nil || attempt == 3 || !strings.Contains(stderr.String(), "address already in use") {
			break
		}
	}
	if urls == nil {
		t.Fatalf("herald demo did not start\n%s", stderr.String())
	}
	require.Len(t, urls, 3)
	for i, u := range urls {
		assert.Equal(t, fmt.Sprintf("http://127.0.0.1:%s/", ports[i]), u)
		code, _ := get(t, u+"health")
		assert.Equal(t, http.StatusOK, code)
	}
	// Instance 1 knows both peers, alive and with their presence known.
	var lastStats string // shown when the mesh does not form
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("instance 1's syncnet stats, last read: %s", lastStats)
		}
	})
	require.Eventually(t, func() bool {
		_, body := get(t, urls[0]+"internal/api/shared-state/stats")
		lastStats = body
		var st struct {
			Syncnet struct {
				Peers []struct {
					Alive bool `json:"alive"`
					Known bool `json:"presenceKnown"`
				} `json:"peers"`
			} `json:"syncnet"`
		}
		if json.Unmarshal([]byte(body), &st) != nil || len(st.Syncnet.Peers) != 2 {
			return false
		}
		for _, p := range st.Syncnet.Peers {
			if !p.Alive || !p.Known {
				return false
			}
		}
		return true
	}, 20*time.Second, 50*time.Millisecond, "the mesh forms")

	// Instance 1's page shows the cluster: itself and two live peers with
	// their consumers, and the producer's messages arriving.
	ctx := browser(t)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(urls[0]),
		chromedp.WaitVisible(chromedp.ID("subscribe")),
		chromedp.SetValue(chromedp.ID("queue"), "demo-q"),
		chromedp.SetValue(chromedp.ID("group"), "viewer"),
		chromedp.Click(chromedp.ID("subscribe")),
	))
	waitJS(ctx, t, "three live instances in the panel", `document.querySelectorAll("#peers .dot.alive").length === 3`)
	waitJS(ctx, t, "the producer's messages arrive", `Number(document.querySelector("#sub-1 .count").textContent) >= 40`)
	waitJS(ctx, t, "the panel shows the subscription", `document.getElementById("version").textContent.includes("1 stream open")`)
	waitJS(ctx, t, "three seconds on the chart", `Number(document.getElementById("chart").dataset.points) >= 3`)
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	artifact(t, "demo-cluster.png", shot)

	// A subscriber on instance 2, a push on instance 1.
	done := make(chan string, 1)
	go func() {
		res, err := http.Get(urls[1] + "api/v1/pop/queue/across?wait=true&timeout=20000&autoAck=true")
		if err != nil {
			done <- err.Error()
			return
		}
		defer func() { _ = res.Body.Close() }()
		var b bytes.Buffer
		_, _ = b.ReadFrom(res.Body)
		done <- fmt.Sprint(res.StatusCode, " ", b.String())
	}()
	require.Eventually(t, func() bool { return metricValue(t, urls[1], "herald_intentions") == 1 },
		10*time.Second, 10*time.Millisecond, "instance 2's subscriber waits")
	pushOne(t, urls[0], "across", `{"hello":"from instance 1"}`)
	select {
	case got := <-done:
		assert.True(t, strings.HasPrefix(got, "200 "), got)
		assert.Contains(t, got, `"hello":"from instance 1"`)
	case <-time.After(15 * time.Second):
		t.Fatal("the message did not reach instance 2")
	}

	// The producer pushes through all three.
	require.Eventually(t, func() bool {
		_, body := get(t, urls[2]+"internal/api/status?queue=demo-q")
		var st struct {
			Queue struct {
				Pushed int64 `json:"pushed"`
			} `json:"queue"`
		}
		return json.Unmarshal([]byte(body), &st) == nil && st.Queue.Pushed >= 6
	}, 20*time.Second, 50*time.Millisecond, "the demo producer pushes")

	pid := postmaster(dir)
	require.Positive(t, pid, "the demo's PostgreSQL runs under --data-dir")
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	select {
	case err := <-exited:
		require.NoError(t, err, stderr.String())
	case <-time.After(time.Minute):
		t.Fatalf("herald demo did not stop within a minute\n%s", stderr.String())
	}
	gone(t, pid, "Ctrl-C stops the demo's PostgreSQL too")
	for _, u := range urls {
		res, err := http.Get(u + "health")
		if err == nil {
			_ = res.Body.Close()
		}
		assert.Error(t, err, "%s is down", u)
	}
}

// startDemo runs herald demo on free ports and waits for its URLs; urls is
// nil if it exited first (or did not start within two minutes).
func startDemo(t *testing.T, bin, dir string) (ports []string, cmd *exec.Cmd, stderr *bytes.Buffer,
	exited chan error, urls []string) {
	t.Helper()
	var syncPorts []string
	for range 3 {
		ports = append(ports, port(t, freeTCP(t)))
		syncPorts = append(syncPorts, port(t, freeUDP(t)))
	}
	cmd = exec.Command(bin, "demo", "--data-dir", dir, "--ports", strings.Join(ports, ","),
		"--sync-ports", strings.Join(syncPorts, ","), "--rate", "20", "--queue", "demo-q")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr = &bytes.Buffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	exited = make(chan error, 1)
	ready := make(chan []string, 1)
	go func() {
		var urls []string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if u := strings.TrimSpace(line); strings.HasPrefix(u, "http://") {
				urls = append(urls, u)
			}
			if strings.Contains(line, "Ctrl-C stops everything") {
				ready <- urls
			}
		}
		exited <- cmd.Wait()
	}()
	select {
	case urls = <-ready:
	case err := <-exited:
		t.Logf("herald demo exited: %v", err)
	case <-time.After(2 * time.Minute):
	}
	return ports, cmd, stderr, exited, urls
}
