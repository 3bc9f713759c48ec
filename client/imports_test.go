package client_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The SDK speaks the protocol; it must not import the server, and neither
// may its tests: a requirement of the server module in go.mod would be
// resolved by every program that imports the SDK.
func TestImportsNoServerPackage(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range files {
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			if strings.HasPrefix(p, "github.com/heraldmq/herald/") && p != "github.com/heraldmq/herald/client" {
				t.Errorf("%s imports %s", f, p)
			}
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}

// The SDK is a module of its own, which names no other Herald module.
func TestGoModRequiresNoServerModule(t *testing.T) {
	b, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	mod := string(b)
	if !strings.Contains(mod, "module github.com/heraldmq/herald/client\n") {
		t.Fatalf("client/go.mod does not declare module github.com/heraldmq/herald/client:\n%s", mod)
	}
	for i, l := range strings.Split(mod, "\n") {
		for _, f := range strings.Fields(l) {
			if f == "github.com/heraldmq/herald" || (strings.HasPrefix(f, "github.com/heraldmq/herald/") && f != "github.com/heraldmq/herald/client") {
				t.Errorf("go.mod:%d names %s: %s", i+1, f, l)
			}
		}
	}
}
