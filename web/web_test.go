package web_test

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/web"
)

func TestHandler(t *testing.T) {
	ts := httptest.NewServer(web.Handler())
	defer ts.Close()
	type answer struct {
		StatusCode int
		Header     http.Header
	}
	get := func(path string) (answer, string) {
		t.Helper()
		res, err := http.Get(ts.URL + path)
		require.NoError(t, err)
		defer func() { _ = res.Body.Close() }()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return answer{res.StatusCode, res.Header}, string(b)
	}
	res, body := get("/")
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Equal(t, "text/html; charset=utf-8", res.Header.Get("Content-Type"))
	assert.Contains(t, body, `<script type="module" src="/app.js">`)
	assert.Equal(t, "no-cache", res.Header.Get("Cache-Control"))

	res, body = get("/herald.js")
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Equal(t, "text/javascript; charset=utf-8", res.Header.Get("Content-Type"))
	assert.Contains(t, body, "export class Herald")

	res, _ = get("/app.css")
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Contains(t, res.Header.Get("Content-Type"), "text/css")

	for _, path := range []string{"/nope.js", "/../go.mod", "/web.go"} {
		res, _ = get(path)
		assert.Equal(t, http.StatusNotFound, res.StatusCode, path)
	}
	assert.ElementsMatch(t, []string{"app.css", "app.js", "herald.js", "index.html"}, web.Names())
}

// The operator console's files are embedded and served under
// /console with their content types; /console itself is its page.
func TestHandler_Console(t *testing.T) {
	ts := httptest.NewServer(web.Handler())
	defer ts.Close()
	type answer struct {
		StatusCode int
		Header     http.Header
	}
	get := func(p string) (answer, string) {
		t.Helper()
		res, err := http.Get(ts.URL + p)
		require.NoError(t, err)
		defer func() { _ = res.Body.Close() }()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return answer{res.StatusCode, res.Header}, string(b)
	}
	for _, p := range []string{"/console", "/console/"} {
		res, body := get(p)
		require.Equal(t, http.StatusOK, res.StatusCode, p)
		assert.Equal(t, "text/html; charset=utf-8", res.Header.Get("Content-Type"), p)
		assert.Contains(t, body, `<script type="module" src="/console/main.js">`, p)
		assert.Equal(t, "no-cache", res.Header.Get("Cache-Control"), p)
	}
	names := web.ConsoleNames()
	for _, want := range []string{"index.html", "console.css", "main.js", "api.js", "ui.js", "overview.js", "queue.js", "dlq.js", "groups.js"} {
		assert.Contains(t, names, want)
	}
	types := map[string]string{".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".html": "text/html; charset=utf-8"}
	for _, name := range names {
		if name == "index.html" {
			continue // served at /console (…/index.html redirects there)
		}
		res, body := get("/console/" + name)
		require.Equal(t, http.StatusOK, res.StatusCode, name)
		assert.Equal(t, types[path.Ext(name)], res.Header.Get("Content-Type"), name)
		assert.NotEmpty(t, body, name)
	}
	for _, p := range []string{"/console/nope.js", "/console/../web.go", "/console/console"} {
		res, _ := get(p)
		assert.Equal(t, http.StatusNotFound, res.StatusCode, p)
	}
	// Every module the console imports is one of its files or the SDK.
	imports := regexp.MustCompile(`(?m)^import .* from "([^"]+)";`)
	for _, name := range names {
		b, err := fs.ReadFile(web.Files(), "console/"+name)
		require.NoError(t, err)
		for _, m := range imports.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if target == "/herald.js" {
				continue
			}
			assert.Contains(t, names, strings.TrimPrefix(target, "./"), "%s imports %s", name, target)
		}
	}
}

// comments are what TestNoRemoteAssets ignores: JS and CSS comments, HTML
// comments (a URL in an example is text, not a load).
var comments = regexp.MustCompile(`(?s)/\*.*?\*/|<!--.*?-->|(?m:(^|\s)//.*$)`)

// Nothing on the demo page or in the console comes from the internet at
// run time: no http(s):// URL in any embedded file outside its comments.
func TestNoRemoteAssets(t *testing.T) {
	n := 0
	err := fs.WalkDir(web.Files(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(web.Files(), name)
		require.NoError(t, err)
		n++
		code := comments.ReplaceAllString(string(b), "")
		assert.NotRegexp(t, `https?://`, code, name)
		assert.NotRegexp(t, `(src|href)="//`, code, name)
		return nil
	})
	require.NoError(t, err)
	assert.Greater(t, n, 8, "the demo page's and the console's files were read")
	assert.Regexp(t, `https?://`, "x = 'https://cdn.example/lib.js'", "the check finds a URL in code")
	assert.NotRegexp(t, `https?://`, comments.ReplaceAllString("// see https://example.com\nx = 1", ""))
}
