package web

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed index.html app.css app.js herald.js console
var files embed.FS

// Files are the embedded files: the demo page's index.html, app.css,
// app.js, the SDK herald.js, and the operator console under console/.
func Files() fs.FS { return files }

// Names lists the files served at /<name>: the demo page's and the SDK,
// not the console's (served under /console/).
func Names() []string {
	entries, _ := fs.ReadDir(files, ".")
	var out []string
	for _, e := range entries {
		if !e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// ConsoleNames lists the operator console's files, served at
// /console/<name> (index.html also at /console).
func ConsoleNames() []string {
	entries, _ := fs.ReadDir(files, "console")
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// Handler serves the files: "/" is index.html, "/<name>" the others,
// "/console" (and "/console/") the console's index.html and
// "/console/<name>" its other files. The pages are small and versioned
// with the binary, so browsers revalidate them every time (no-cache) and
// get 304s.
func Handler() http.Handler {
	fileServer := http.FileServerFS(files)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(path.Clean(r.URL.Path), "/")
		switch name {
		case "":
			name = "index.html"
		case "console":
			name = "console/index.html"
		}
		if st, err := fs.Stat(files, name); err != nil || st.IsDir() {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if strings.HasSuffix(name, ".js") {
			w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		}
		if path.Base(name) == "index.html" {
			// FileServer redirects …/index.html to …/; serve it directly.
			http.ServeFileFS(w, r, files, name) // #nosec G703 -- an embedded FS, and name is a file found in it
			return
		}
		fileServer.ServeHTTP(w, r)
	})
}
