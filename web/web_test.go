package web_test

import (
	"io"
	"net/http"
	"net/http/httptest"
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

// Nothing on the page comes from the internet at run time.
func TestNoRemoteAssets(t *testing.T) {
	for _, name := range web.Names() {
		b, err := io.ReadAll(must(web.Files().Open(name)))
		require.NoError(t, err)
		assert.NotRegexp(t, `(src|href)="https?://`, string(b), name)
		assert.NotRegexp(t, `import[^;]*from\s+"https?://`, string(b), name)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
