package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// messagePath are the packages a message passes through (push, wake, pop,
// frame, ack, follow): their functions are each short enough to read at
// once. Administration's reads (queue's browse and delete) are not on it.
var messagePath = []string{"gateway", "poller", "syncnet", "pgnotify", "spool", "queue"}

// notMessagePath are the files of those packages that serve administration
// or maintenance, not a message on its way.
var notMessagePath = []string{"queue/browse", "queue/message_delete", "queue/retention", "queue/hygiene",
	"queue/dlq_", "queue/status", "queue/postgres_stats", "queue/traces", "queue/migrate"}

// maxFuncLines is the longest a message-path function may be, its
// signature and closing brace included.
const maxFuncLines = 80

func TestFuncs_MessagePathFunctionsAreShort(t *testing.T) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("finding the module: go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	fset := token.NewFileSet()
	seen := 0
	for _, pkg := range messagePath {
		files, err := filepath.Glob(filepath.Join(root, pkg, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files in %s: %v", pkg, err)
		}
		for _, f := range files {
			rel, _ := filepath.Rel(root, f)
			if strings.HasSuffix(f, "_test.go") || hasAnyPrefix(filepath.ToSlash(rel), notMessagePath) {
				continue
			}
			file, err := parser.ParseFile(fset, f, nil, 0)
			if err != nil {
				t.Fatalf("parsing %s: %v", rel, err)
			}
			for _, d := range file.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				seen++
				if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines {
					t.Errorf("%s: %s is %d lines (at most %d on the message path): split it by step", rel, fd.Name.Name, n, maxFuncLines)
				}
			}
		}
	}
	if seen < 500 {
		t.Fatalf("read %d functions: the package list no longer matches the tree", seen)
	}
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
