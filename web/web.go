package web

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed index.html app.css app.js herald.js
var files embed.FS

// Files are the page's files: index.html, app.css, app.js and herald.js.
func Files() fs.FS { return files }

// Names lists the files served at /<name>.
func Names() []string {
	entries, _ := fs.ReadDir(files, ".")
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// Handler serves the files: "/" is index.html, "/<name>" the others. The
// page is small and versioned with the binary, so browsers revalidate it
// every time (no-cache) and get 304s.
func Handler() http.Handler {
	fileServer := http.FileServerFS(files)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(path.Clean(r.URL.Path), "/")
		if name == "" {
			name = "index.html"
		}
		if _, err := fs.Stat(files, name); err != nil {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if strings.HasSuffix(name, ".js") {
			w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		}
		if name == "index.html" {
			// FileServer redirects /index.html to /; serve it directly.
			http.ServeFileFS(w, r, files, "index.html")
			return
		}
		fileServer.ServeHTTP(w, r)
	})
}
