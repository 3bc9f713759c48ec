package client_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The recipe of docs/clients.md for using the SDK from a clone runs as
// printed in a fresh module (the clone's path in place of /path/to/herald)
// and a program importing the SDK then builds and runs. Offline: the module
// cache already holds what the SDK requires (its own tests need it), so
// the proxy and the checksum database are off.
func TestClientsDoc_SDKFromACloneBuilds(t *testing.T) {
	doc, err := os.ReadFile("../docs/clients.md")
	require.NoError(t, err)
	var recipe []string
	for _, b := range fencedBlocks(string(doc), "sh") {
		if strings.HasPrefix(b.text, "go mod edit -require=github.com/heraldmq/herald/client") {
			recipe = strings.Split(strings.TrimSpace(b.text), "\n")
		}
	}
	require.Len(t, recipe, 2, "docs/clients.md has the two lines that use the SDK from a clone")
	clone, err := filepath.Abs("..")
	require.NoError(t, err)

	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...) // #nosec G204 -- the documentation's own lines
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOPROXY=off", "GOSUMDB=off", "GOFLAGS=-mod=mod", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %v: %s", name, args, out)
		return string(out)
	}
	run("go", "mod", "init", "example.com/app")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(`package main

import (
	"fmt"

	"github.com/heraldmq/herald/client"
)

func main() { fmt.Println("dial:", client.Dial != nil) }
`), 0o600))
	for _, l := range recipe {
		run("sh", "-c", strings.ReplaceAll(l, "/path/to/herald", clone))
	}
	require.Contains(t, run("go", "run", "."), "dial: true")
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	require.NoError(t, err)
	require.Contains(t, string(mod), "=> "+filepath.Join(clone, "client"), "the module builds against the clone")
}
