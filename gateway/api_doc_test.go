package gateway_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/web"
)

// docs/api.md names every route the gateway registers (as
// "`METHOD /path`", the pattern as registered; `GET /{$}` is written
// `GET /`), every WebSocket close code it sends (a row "| code |" of the
// close code table), every WebSocket frame type it reads or writes and
// every code of its error frames (as "`name`").
//
// The routes are read from the gateway's source: every call of the
// Server's handle and stream methods, the only ones that register (a
// registration anywhere else fails the test); the web files' routes are
// expanded with web.Names. A real gateway's mux then confirms that each
// pattern read is one it serves, so a misread source fails too.
func TestAPIDoc_ListsEveryRoute(t *testing.T) {
	doc, err := os.ReadFile("../docs/api.md")
	require.NoError(t, err)
	api := string(doc)
	src := parseGateway(t)

	routes := registeredRoutes(t, src)
	require.Contains(t, routes, "POST /api/v1/push", "the routes were read from the source")
	require.Contains(t, routes, "GET /herald.js", "the web files' routes were expanded")

	mux := newEnv(t).srv.Mux()
	for _, pattern := range routes {
		method, path, _ := strings.Cut(pattern, " ")
		if path == "" { // a pattern without a method
			method, path = "PATCH", pattern
		}
		// A request the pattern matches: wildcards filled in.
		reqPath := regexp.MustCompile(`\{\$\}`).ReplaceAllString(path, "")
		reqPath = regexp.MustCompile(`\{[^}]+\}`).ReplaceAllString(reqPath, "x")
		if strings.HasSuffix(reqPath, "/") && pattern != "OPTIONS /" && !strings.HasSuffix(path, "{$}") {
			reqPath += "no-such-route"
		}
		_, got := mux.Handler(httptest.NewRequest(method, reqPath, nil))
		assert.Equal(t, pattern, got, "the gateway serves %s %s by the pattern read from its source", method, reqPath)

		shown := strings.ReplaceAll(pattern, "{$}", "")
		if !strings.Contains(api, "`"+shown+"`") {
			t.Errorf("docs/api.md does not name the route %s (as `%s`)", pattern, shown)
		}
	}

	codes := closeCodes(t, src)
	for _, want := range []int{4000, 4001, 4500, 4501, 4503, websocket.CloseMessageTooBig} {
		require.Contains(t, codes, want, "the close codes were read from the source")
	}
	for _, c := range codes {
		if !strings.Contains(api, "| "+strconv.Itoa(c)+" |") {
			t.Errorf("docs/api.md's close code table has no row for %d", c)
		}
	}

	frames, errCodes := wsFrames(t, src)
	for _, want := range []string{"subscribe", "ack", "ping", "deliver", "ack_result", "pong", "error"} {
		require.Contains(t, frames, want, "the frame types were read from the source")
	}
	require.Contains(t, errCodes, "bad_frame", "the error frame codes were read from the source")
	for _, f := range frames {
		if !strings.Contains(api, "`"+f+"`") {
			t.Errorf("docs/api.md does not name the WebSocket frame type `%s`", f)
		}
	}
	for _, c := range errCodes {
		if !strings.Contains(api, "`"+c+"`") {
			t.Errorf("docs/api.md does not name the error frame code `%s`", c)
		}
	}
	t.Logf("%d routes, close codes %v, frame types %v, error codes %v", len(routes), codes, frames, errCodes)
}

// parseGateway parses the gateway's non-test Go files.
func parseGateway(t *testing.T) map[string]*ast.File {
	t.Helper()
	names, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		files[name] = f
	}
	require.NotEmpty(t, files)
	return files
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// registeredRoutes are the patterns of every handle, read, stream and
// followRoute call with a literal pattern (in a Server method, every one
// must have one). http.ServeMux's Handle and HandleFunc may be called only
// inside Server.handle, Server.read and Server.longLived.
func registeredRoutes(t *testing.T, files map[string]*ast.File) []string {
	t.Helper()
	var routes []string
	for name, f := range files {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			server := fn.Recv != nil && recvType(fn) == "Server"
			helper := server && (fn.Name.Name == "handle" || fn.Name.Name == "read" || fn.Name.Name == "longLived")
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) == 0 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				switch sel.Sel.Name {
				case "Handle", "HandleFunc":
					if !helper {
						t.Errorf("%s: %s registers a route outside Server.handle, Server.read and Server.longLived (stream, followRoute)", name, fn.Name.Name)
					}
				case "handle", "read", "stream", "followRoute":
					switch arg := call.Args[0].(type) {
					case *ast.BasicLit:
						p, ok := stringLit(arg)
						require.True(t, ok, "%s: a route pattern", name)
						routes = append(routes, p)
					case *ast.BinaryExpr: // "GET /"+name: the web files
						prefix, ok := stringLit(arg.X)
						require.True(t, ok && arg.Op == token.ADD, "%s: a route pattern this test cannot read", name)
						for _, file := range web.Names() {
							if file != "index.html" { // served at GET /{$}
								routes = append(routes, prefix+file)
							}
						}
					default:
						// Other methods named handle (wsConn's, of frames)
						// take no pattern; a Server's must be readable.
						if server {
							t.Errorf("%s: %s registers a route whose pattern this test cannot read: %T", name, fn.Name.Name, arg)
						}
					}
				}
				return true
			})
		}
	}
	slices.Sort(routes)
	return slices.Compact(routes)
}

// closeCodes are the values of the gateway's Close* constants and of the
// websocket package's close codes the gateway uses.
func closeCodes(t *testing.T, files map[string]*ast.File) []int {
	t.Helper()
	gorilla := map[string]int{
		"CloseNormalClosure": websocket.CloseNormalClosure, "CloseGoingAway": websocket.CloseGoingAway,
		"CloseProtocolError": websocket.CloseProtocolError, "CloseUnsupportedData": websocket.CloseUnsupportedData,
		"CloseNoStatusReceived": websocket.CloseNoStatusReceived, "CloseAbnormalClosure": websocket.CloseAbnormalClosure,
		"CloseInvalidFramePayloadData": websocket.CloseInvalidFramePayloadData,
		"ClosePolicyViolation":         websocket.ClosePolicyViolation, "CloseMessageTooBig": websocket.CloseMessageTooBig,
		"CloseMandatoryExtension": websocket.CloseMandatoryExtension, "CloseInternalServerErr": websocket.CloseInternalServerErr,
		"CloseServiceRestart": websocket.CloseServiceRestart, "CloseTryAgainLater": websocket.CloseTryAgainLater,
		"CloseTLSHandshake": websocket.CloseTLSHandshake,
	}
	var codes []int
	for name, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if !strings.HasPrefix(id.Name, "Close") || i >= len(n.Values) {
						continue
					}
					lit, ok := n.Values[i].(*ast.BasicLit)
					require.True(t, ok && lit.Kind == token.INT, "%s: the close code %s is an integer literal", name, id.Name)
					c, err := strconv.Atoi(lit.Value)
					require.NoError(t, err)
					codes = append(codes, c)
				}
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "websocket" {
					if c, ok := gorilla[n.Sel.Name]; ok {
						codes = append(codes, c)
					}
				}
			}
			return true
		})
	}
	slices.Sort(codes)
	return slices.Compact(codes)
}

// wsFrames are the WebSocket frame types the gateway reads (the cases of
// wsConn.handle) and writes ("type" keys and Type fields with a literal
// value), and the codes of its error frames (wsError's second argument).
func wsFrames(t *testing.T, files map[string]*ast.File) (types, errCodes []string) {
	t.Helper()
	for _, f := range files {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			reader := fn.Recv != nil && fn.Name.Name == "handle" && recvType(fn) == "wsConn"
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CaseClause:
					if reader {
						for _, e := range n.List {
							if s, ok := stringLit(e); ok {
								types = append(types, s)
							}
						}
					}
				case *ast.KeyValueExpr:
					key, isKey := stringLit(n.Key)
					field, isField := n.Key.(*ast.Ident)
					if (isKey && key == "type") || (isField && field.Name == "Type") {
						if s, ok := stringLit(n.Value); ok {
							types = append(types, s)
						}
					}
				case *ast.CallExpr:
					if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "wsError" && len(n.Args) > 1 {
						if s, ok := stringLit(n.Args[1]); ok {
							errCodes = append(errCodes, s)
						}
					}
				}
				return true
			})
		}
	}
	slices.Sort(types)
	slices.Sort(errCodes)
	return slices.Compact(types), slices.Compact(errCodes)
}

func recvType(fn *ast.FuncDecl) string {
	typ := fn.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}
