package layout_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// The rules of STYLE.md "Docs", checked on every package of the module:
//
//   - each package directory has a doc.go holding the package comment. A
//     library's begins "Package <name> "; a command's (package main) begins
//     with the command's name, first letter in upper case ("Herald ",
//     "Herald-bench "), as Go's own commands do (go.dev/doc/comment#cmd).
//     No other non-test file of the package carries a package comment, so
//     go doc shows the one that is kept up to date.
//   - a package whose non-test code starts goroutines (a go statement, a
//     call of a method named Go: errgroup.Group.Go, sync.WaitGroup.Go, or
//     time.AfterFunc) says
//     who owns them and what happens on failure: its doc.go has the headings
//     "# Concurrency" and "# Failures".
//   - a file a doc.go names (`replay.go`, `docs/design.md`,
//     `testdata/x.json`) exists, beside the package or from the module root.

// skipDirs are not packages of this module: separate modules (their own
// go.mod; also caught by the go.mod check below).
var skipDirs = []string{"bench/peers", "client"}

// pkg is one package directory of the module.
type pkg struct {
	dir     string // relative to the module root, slash-separated
	name    string // the package clause of its non-test files (or its tests')
	files   []*ast.File
	names   []string // file names of files, in order
	goStart string   // where non-test code starts a goroutine ("" when it does not)
}

// moduleRoot is the directory of the go.mod above this file.
func moduleRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller gave no file")
	}
	for dir := filepath.Dir(file); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if dir == filepath.Dir(dir) {
			t.Fatalf("no go.mod above %s", file)
		}
	}
}

// packages parses every package directory of the module (build tags
// ignored: reliability/ builds only with its tag and is checked all the
// same).
func packages(t *testing.T, root string) []*pkg {
	t.Helper()
	var out []*pkg
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if rel != "." {
			base := d.Name()
			if base == "testdata" || strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") ||
				slices.Contains(skipDirs, rel) {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own
			}
		}
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		p := &pkg{dir: rel}
		var testName string
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(path, e.Name()), nil, parser.ParseComments)
			if err != nil {
				return err
			}
			if strings.HasSuffix(e.Name(), "_test.go") {
				testName = strings.TrimSuffix(f.Name.Name, "_test")
				continue
			}
			p.name = f.Name.Name
			p.files, p.names = append(p.files, f), append(p.names, e.Name())
			if p.goStart == "" {
				if pos := startsGoroutine(f); pos.IsValid() {
					p.goStart = fmt.Sprintf("%s/%s:%d", rel, e.Name(), fset.Position(pos).Line)
				}
			}
		}
		if p.name == "" {
			p.name = testName // a package of tests only
		}
		if p.name != "" {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking the module: %v", err)
	}
	return out
}

// startsGoroutine is the position of the first go statement, call of a
// method named Go, or time.AfterFunc (its func runs on a goroutine of its
// own) in f; not valid when there is none.
func startsGoroutine(f *ast.File) token.Pos {
	var at token.Pos
	ast.Inspect(f, func(n ast.Node) bool {
		if at.IsValid() {
			return false
		}
		switch n := n.(type) {
		case *ast.GoStmt:
			at = n.Pos()
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && (sel.Sel.Name == "Go" || sel.Sel.Name == "AfterFunc") {
				at = n.Pos()
			}
		}
		return true
	})
	return at
}

// docOf is the package comment of p's doc.go; ok is false without a doc.go.
func (p *pkg) docOf() (doc string, ok bool) {
	i := slices.Index(p.names, "doc.go")
	if i < 0 {
		return "", false
	}
	if c := p.files[i].Doc; c != nil {
		return c.Text(), true
	}
	return "", true
}

// wantOpening is how p's package comment must begin.
func (p *pkg) wantOpening() string {
	if p.name != "main" {
		return "Package " + p.name + " "
	}
	cmd := filepath.Base(filepath.FromSlash(p.dir))
	r, n := utf8.DecodeRuneInString(cmd)
	return string(unicode.ToUpper(r)) + cmd[n:] + " "
}

func hasHeading(doc, heading string) bool {
	for line := range strings.SplitSeq(doc, "\n") {
		if line == heading {
			return true
		}
	}
	return false
}

func TestDocs_EveryPackageHasADocGo(t *testing.T) {
	root := moduleRoot(t)
	pkgs := packages(t, root)
	var dirs []string
	for _, p := range pkgs {
		dirs = append(dirs, p.dir)
	}
	// The walk found the module's packages, and only those.
	for _, want := range []string{"gateway", "queue", "cmd/herald", "internal/layout", "reliability"} {
		if !slices.Contains(dirs, want) {
			t.Fatalf("the walk from %s found no package %s (found %v)", root, want, dirs)
		}
	}
	if slices.Contains(dirs, "bench/peers") {
		t.Fatal("the walk entered bench/peers, a module of its own")
	}
	goroutines := 0
	for _, p := range pkgs {
		t.Run(strings.ReplaceAll(p.dir, "/", "_"), func(t *testing.T) {
			doc, ok := p.docOf()
			if !ok {
				t.Fatalf("%s has no doc.go (STYLE.md, Docs: a doc.go per package)", p.dir)
			}
			if want := p.wantOpening(); !strings.HasPrefix(doc, want) {
				t.Errorf("%s/doc.go: the package comment must begin %q", p.dir, want)
			}
			for i, f := range p.files {
				if p.names[i] != "doc.go" && f.Doc != nil {
					t.Errorf("%s/%s has a package comment too: keep it in doc.go only", p.dir, p.names[i])
				}
			}
			if p.goStart == "" {
				return
			}
			goroutines++
			t.Logf("%s starts goroutines (%s)", p.dir, p.goStart)
			for _, h := range []string{"# Concurrency", "# Failures"} {
				if !hasHeading(doc, h) {
					t.Errorf("%s starts goroutines (%s): its doc.go needs a %q section", p.dir, p.goStart, h)
				}
			}
		})
	}
	if goroutines == 0 {
		t.Error("no package was seen to start a goroutine: the detection is broken")
	}
}

// pathToken is a file name a doc comment may cite: a path of name
// characters ending in an extension of the repository's files.
var pathToken = regexp.MustCompile(`[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.(go|md|json|sql|js|css|html|yml|yaml|txt|png)\b`)

// citedPaths are the file paths doc cites. URLs and absolute paths (files
// a program writes, documentation elsewhere) are not the repository's.
func citedPaths(doc string) []string {
	var out []string
	for word := range strings.FieldsSeq(doc) {
		if strings.Contains(word, "://") || strings.Contains(word, "go.dev/") {
			continue
		}
		for _, m := range pathToken.FindAllStringIndex(word, -1) {
			tok := word[m[0]:m[1]]
			if m[0] > 0 && strings.ContainsAny(word[m[0]-1:m[0]], "/~$") {
				continue
			}
			if strings.HasPrefix(tok, "/") {
				continue
			}
			out = append(out, strings.TrimRight(tok, "."))
		}
	}
	return out
}

func TestDocs_NoDeadReferences(t *testing.T) {
	root := moduleRoot(t)
	cited := 0
	for _, p := range packages(t, root) {
		doc, ok := p.docOf()
		if !ok {
			continue // TestDocs_EveryPackageHasADocGo says so
		}
		for _, path := range citedPaths(doc) {
			cited++
			found := false
			for _, base := range []string{filepath.Join(root, filepath.FromSlash(p.dir)), root} {
				if _, err := os.Stat(filepath.Join(base, filepath.FromSlash(path))); err == nil {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s/doc.go cites %s, which is neither in %s nor from the module root", p.dir, path, p.dir)
			}
		}
	}
	if cited == 0 {
		t.Error("no doc.go cites a file: the path detection is broken")
	}
}

// The detection of cited paths, on the shapes doc comments use.
func TestDocs_CitedPaths(t *testing.T) {
	doc := "Replay (replay.go) and docs/design.md, \"x\"; the datagrams in testdata/reference-packets.json:\n" +
		"see https://go.dev/doc/comment.md and /tmp/out.json; go:embed web/*.js; version 1.2."
	got := citedPaths(doc)
	want := []string{"replay.go", "docs/design.md", "testdata/reference-packets.json"}
	if !slices.Equal(got, want) {
		t.Errorf("citedPaths = %q, want %q", got, want)
	}
}
