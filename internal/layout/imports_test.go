package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// module is the import path every rule below is relative to.
const module = "github.com/heraldmq/herald"

// rule is what a package may import of the module, by module-relative path:
// "x" is x alone, "x/..." is x and every package below it.
type rule struct {
	imports []string // in the package's own files
	tests   []string // in its tests, besides imports and itself
}

// testHelpers are packages only tests import: a throwaway PostgreSQL and a
// store on it.
var testHelpers = []string{"internal/pgtest", "queue/queuetest"}

// tokens makes the tests' bearer tokens: the auth package's tests, the
// gateway's and the commands' build them one way.
var tokens = []string{"auth/authtest"}

// assembly is what a test that runs whole instances may import (the
// multi-instance tests of pgnotify and syncnet, gateway's end-to-end
// tests): every server package.
var assembly = []string{"admin", "auth", "gateway", "internal/...", "pgnotify", "poller", "queue/...", "spool", "syncnet", "web"}

// design is docs/design.md §1 as import rules, one row per package.
var design = map[string]rule{
	"queue":           {tests: testHelpers},
	"queue/queuetest": {imports: []string{"queue", "internal/pgtest"}},
	"poller":          {imports: []string{"queue"}, tests: testHelpers},
	"pgnotify":        {tests: assembly},
	"syncnet":         {tests: assembly},
	"spool":           {},
	"web":             {},
	"auth":            {tests: tokens}, // tokens, rights, JWKS, the cookie rule: no store, no handlers
	"auth/authtest":   {},              // tokens for tests
	// The message path's server; it registers the admin routes (admin.Register).
	"gateway": {imports: []string{"admin", "auth", "internal/history", "internal/httpapi", "poller", "queue", "spool", "web"}, tests: slices.Concat(assembly, testHelpers, tokens)},
	// Administration: its routes through the gateway's registration, never the gateway itself.
	"admin":            {imports: []string{"auth", "internal/history", "internal/httpapi", "queue"}, tests: slices.Concat(assembly, testHelpers)},
	"internal/httpapi": {imports: []string{"queue"}}, // answers, bodies, the error adapter: no routes
	// What the instance did: the message path records, admin reads.
	"internal/history":   {imports: []string{"internal/tick", "queue"}},
	"internal/tick":      {}, // the process's aligned wake-ups: imports no Herald package
	"internal/pgcluster": {},
	"internal/pgtest":    {imports: []string{"internal/pgcluster"}},
	"internal/backoff":   {},
	"internal/layout":    {},
	// The assembly: every component, no command.
	"internal/server": {imports: assembly, tests: assembly},
	// Whole instances for the multi-instance tests.
	"internal/server/servertest": {imports: assembly},
	// The chaos suite runs the herald binary; its files carry a build tag.
	"reliability": {},
	// client is the SDK's own module (github.com/heraldmq/herald/client).
	// The binary serves through internal/server (its flags' defaults
	// included: server.Defaults); auth for `herald token`, pgcluster for
	// `herald demo`'s private PostgreSQL.
	"cmd/herald":       {imports: []string{"auth", "internal/server", "internal/pgcluster"}, tests: slices.Concat(assembly, tokens, []string{"client"})},
	"cmd/herald-bench": {imports: []string{"client", "internal/benchstat", "internal/fanoutload"}, tests: slices.Concat(assembly, []string{"client"})},
	// The fanout benchmarks' followers (bench/peers uses them too).
	"internal/fanoutload": {},
	// The latency recorder and percentiles of the benchmarks (bench/peers too).
	"internal/benchstat": {},
}

// listed is one package as go list -json reports it.
type listed struct {
	ImportPath                         string
	Imports, TestImports, XTestImports []string
	Error                              *struct{ Err string }
}

func TestImports_FollowDesign(t *testing.T) {
	pkgs := listModule(t)
	if len(pkgs) < len(design)/2 {
		t.Fatalf("go list found %d packages: the module was not read", len(pkgs))
	}
	for _, p := range pkgs {
		rel, ok := relative(p.ImportPath)
		if !ok {
			continue
		}
		r, known := design[rel]
		if !known {
			t.Errorf("%s has no row in internal/layout's table: decide what it may import (docs/design.md §1)", rel)
			continue
		}
		for _, imp := range p.Imports {
			if dep, ok := relative(imp); ok && !allowed(dep, r.imports) {
				t.Errorf("%s imports %s: docs/design.md §1 lets it import %s", rel, dep, describe(r.imports))
			}
		}
		tests := append(slices.Clone(r.imports), r.tests...)
		tests = append(tests, rel)
		for _, imp := range append(slices.Clone(p.TestImports), p.XTestImports...) {
			if dep, ok := relative(imp); ok && !allowed(dep, tests) {
				t.Errorf("the tests of %s import %s: docs/design.md §1 lets them import %s", rel, dep, describe(tests))
			}
		}
	}
}

// The rules' own logic: prefixes match whole path elements.
func TestAllowed(t *testing.T) {
	for _, c := range []struct {
		dep   string
		rules []string
		want  bool
	}{
		{"queue", []string{"queue"}, true},
		{"queue/queuetest", []string{"queue"}, false},
		{"queue/queuetest", []string{"queue/..."}, true},
		{"queue", []string{"queue/..."}, true},
		{"queuex", []string{"queue/..."}, false},
		{"syncnet", nil, false},
	} {
		if got := allowed(c.dep, c.rules); got != c.want {
			t.Errorf("allowed(%q, %q) = %v, want %v", c.dep, c.rules, got, c.want)
		}
	}
}

// listModule runs go list over every package of the module, from its root.
func listModule(t *testing.T) []listed {
	t.Helper()
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("finding the module: go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,TestImports,XTestImports,Error", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("listing packages in %s: %v\n%s", root, err, stderr.String())
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("reading go list's output: %v", err)
		}
		if p.Error != nil {
			t.Errorf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// relative is path relative to the module; ok is false for other modules'
// packages and the standard library.
func relative(path string) (string, bool) {
	if rest, ok := strings.CutPrefix(path, module+"/"); ok {
		return rest, true
	}
	return "", false
}

// allowed reports whether dep matches one of rules.
func allowed(dep string, rules []string) bool {
	for _, r := range rules {
		if base, tree := strings.CutSuffix(r, "/..."); tree {
			if dep == base || strings.HasPrefix(dep, base+"/") {
				return true
			}
		} else if dep == r {
			return true
		}
	}
	return false
}

func describe(rules []string) string {
	if len(rules) == 0 {
		return "no Herald package"
	}
	return "only " + strings.Join(rules, ", ")
}
