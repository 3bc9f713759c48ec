package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// repoRoot is the repository's root, seen from this package's directory.
const repoRoot = "../.."

// Every link of the README and of docs/*.md (markdown links,
// images, reference definitions, HTML href and src) to a file of the
// repository names a file or directory that exists, inside the repository;
// a #anchor into a markdown file names one of its headings (GitHub's
// slugs); no page points outside the repository (no ../shared); and the
// README links to every page of docs/ written for a reader and to the
// changelog.
// http(s) and mailto links are not followed.
func TestReadme_LinksResolve(t *testing.T) {
	pages := []string{"README.md", "CHANGELOG.md"}
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	require.NoError(t, err)
	for _, d := range docs {
		pages = append(pages, filepath.ToSlash(must(filepath.Rel(repoRoot, d))))
	}
	require.Contains(t, pages, "docs/design.md")
	require.Contains(t, pages, "docs/api.md")

	root, err := filepath.Abs(repoRoot)
	require.NoError(t, err)
	anchors := map[string]map[string]bool{} // markdown file (from the root) → its heading slugs
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		b, err := os.ReadFile(filepath.Join(root, page))
		require.NoError(t, err)
		anchors[page] = headingSlugs(string(b))
		return anchors[page]
	}

	checked := 0
	readmeLinks := map[string]bool{} // files of the repository the README links to
	for _, page := range pages {
		b, err := os.ReadFile(filepath.Join(root, page))
		require.NoError(t, err)
		text := string(b)
		if strings.Contains(text, "../shared") {
			t.Errorf("%s points outside the repository: it mentions ../shared", page)
		}
		for _, l := range markdownLinks(text) {
			where := fmt.Sprintf("%s:%d: link %q", page, l.line, l.target)
			target := l.target
			if u := strings.ToLower(target); strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://") ||
				strings.HasPrefix(u, "mailto:") {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(target, "#")
			path = strings.SplitN(path, "?", 2)[0]
			var file string // from the root, slash-separated
			switch {
			case path == "":
				file = page
			case strings.HasPrefix(path, "/"): // GitHub resolves these from the repository's root
				file = filepath.ToSlash(filepath.Clean(strings.TrimPrefix(path, "/")))
			default:
				file = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(page), path)))
			}
			if file == ".." || strings.HasPrefix(file, "../") {
				t.Errorf("%s: points outside the repository (%s)", where, file)
				continue
			}
			if _, err := os.Stat(filepath.Join(root, file)); err != nil {
				t.Errorf("%s: no such file in the repository: %s", where, file)
				continue
			}
			if page == "README.md" {
				readmeLinks[file] = true
			}
			if anchor != "" && strings.HasSuffix(file, ".md") && !anchorsOf(file)[anchor] {
				t.Errorf("%s: %s has no heading whose anchor is #%s", where, file, anchor)
			}
		}
	}
	for _, doc := range []string{"docs/operating.md", "docs/clients.md", "docs/design.md", "docs/api.md",
		"docs/failover.md", "docs/benchmarks.md", "docs/development.md", "CHANGELOG.md"} {
		if !readmeLinks[doc] {
			t.Errorf("README.md does not link to %s", doc)
		}
	}
	require.Positive(t, checked, "the pages link to files of the repository (docs/design.md, docs/api.md)")
	t.Logf("%d links into the repository checked in %d pages", checked, len(pages))
}

// The README is read in five minutes: at most 200 lines, and it never
// sends its reader outside the repository (no web address but the local
// server's, in prose or in a link; the code blocks talk to localhost).
func TestReadme_ShortAndSelfContained(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	readme := string(b)
	lines := strings.Count(readme, "\n")
	assert.LessOrEqual(t, lines, 200, "README.md has %d lines", lines)
	web := regexp.MustCompile(`(?i)\b(?:https?://|www\.)[^\s)>\]` + "`" + `"']*`)
	forEachProseLine(readme, func(n int, l string) {
		for _, u := range web.FindAllString(l, -1) {
			if !strings.HasPrefix(strings.ToLower(u), "http://localhost:") {
				t.Errorf("README.md:%d: points outside the repository: %s", n, u)
			}
		}
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

type mdLink struct {
	line   int
	target string
}

var (
	// [text](target "title") and ![alt](target): the target, up to a
	// blank or the closing parenthesis (<…> allows blanks).
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*(<[^>]*>|[^\s)]*)`)
	// [label]: target
	refLink = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)`)
	// href="…" and src="…" of inline HTML.
	htmlLink   = regexp.MustCompile(`(?i)\b(?:href|src)\s*=\s*["']([^"']*)["']`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	headingRe  = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	linkInText = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// markdownLinks returns the link targets of md outside fenced code blocks
// and code spans.
func markdownLinks(md string) []mdLink {
	var out []mdLink
	forEachProseLine(md, func(n int, l string) {
		l = codeSpan.ReplaceAllString(l, "")
		for _, re := range []*regexp.Regexp{inlineLink, refLink, htmlLink} {
			for _, m := range re.FindAllStringSubmatch(l, -1) {
				out = append(out, mdLink{line: n, target: strings.Trim(m[1], "<>")})
			}
		}
	})
	return out
}

// forEachProseLine calls f with each line (and its 1-based number) that is
// not inside a fenced code block.
func forEachProseLine(md string, f func(n int, line string)) {
	fence := ""
	for i, l := range strings.Split(md, "\n") {
		t := strings.TrimSpace(l)
		if fence != "" {
			if strings.HasPrefix(t, fence) && strings.Trim(t, fence[:1]) == "" {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fence = t[:len(t)-len(strings.TrimLeft(t, t[:1]))]
			continue
		}
		f(i+1, l)
	}
}

// headingSlugs are the anchors GitHub gives the headings of md: the
// heading's text (link and code markup removed) in lower case, spaces
// turned into '-', every other character but letters, marks, numbers,
// '-' and connector punctuation ('_') dropped; a repeated slug gets -1,
// -2, … .
func headingSlugs(md string) map[string]bool {
	slugs := map[string]bool{}
	seen := map[string]int{}
	forEachProseLine(md, func(_ int, l string) {
		m := headingRe.FindStringSubmatch(l)
		if m == nil {
			return
		}
		s := githubSlug(m[2])
		if n := seen[s]; n > 0 {
			seen[s] = n + 1
			s = fmt.Sprintf("%s-%d", s, n)
		} else {
			seen[s] = 1
		}
		slugs[s] = true
	})
	return slugs
}

func githubSlug(heading string) string {
	text := linkInText.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.Pc):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestReadme_GitHubSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Reference exchanges":                                          "reference-exchanges",
		"Browser SDK (`web/herald.js`)":                                "browser-sdk-webheraldjs",
		"Three instances: `herald demo` or `docker compose up`":        "three-instances-herald-demo-or-docker-compose-up",
		"Leases and acks: the contract":                                "leases-and-acks-the-contract",
		"SSE: `GET /api/v1/sse/queue/{queue}[/partition/{partition}]`": "sse-get-apiv1ssequeuequeuepartitionpartition",
		"The [design](design.md) page":                                 "the-design-page",
		"snake_case and-dash":                                          "snake_case-and-dash",
	} {
		if got := githubSlug(heading); got != want {
			t.Errorf("githubSlug(%q) = %q, want %q", heading, got, want)
		}
	}
	slugs := headingSlugs("# A\n## A\n```\n# not a heading\n```\n### A ###\n")
	for _, s := range []string{"a", "a-1", "a-2"} {
		if !slugs[s] {
			t.Errorf("headingSlugs: no %q in %v", s, slugs)
		}
	}
	if slugs["not-a-heading"] {
		t.Errorf("headingSlugs: a line in a code block is not a heading")
	}
}

// The README's test command is the one `make test` runs (and
// docs/development.md says so) and the one .ci/run runs, and it reaches the Go SDK, a module of its own that
// `go test ./...` at the root does not.
func TestReadme_TestCommandIsMakeTestAndCI(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(repoRoot, name))
		require.NoError(t, err)
		return string(b)
	}
	var readme, makeTest string // the quick start's command; docs/development.md's `make test` line
	for _, page := range []string{"README.md", "docs/development.md"} {
		for l := range strings.Lines(read(page)) {
			cmd, comment, _ := strings.Cut(strings.TrimSpace(l), "#")
			cmd, comment = strings.TrimSpace(cmd), strings.TrimSpace(comment)
			switch {
			case page == "README.md" && strings.HasSuffix(comment, "(make test)"):
				readme = cmd
			case page == "docs/development.md" && cmd == "make test":
				makeTest = comment
			}
		}
	}
	require.NotEmpty(t, readme, "the README's quick start has a command marked (make test)")
	assert.Equal(t, readme, makeTest, "docs/development.md says what make test runs")
	assert.Contains(t, readme, "(cd client && go test", "the whole suite includes the SDK's module")

	var recipe []string
	inTest := false
	for l := range strings.Lines(read("Makefile")) {
		switch {
		case strings.HasPrefix(l, "test:"):
			inTest = true
		case inTest && strings.HasPrefix(l, "\t"):
			// What make hands the shell: $$ is a $.
			recipe = append(recipe, strings.ReplaceAll(strings.TrimSpace(l), "$$", "$"))
		default:
			inTest = false
		}
	}
	assert.Equal(t, []string{readme}, recipe, "make test runs the README's test command")

	ran, errexit := false, true
	for l := range strings.Lines(read(".ci/run")) {
		switch l = strings.TrimSpace(l); {
		case strings.HasPrefix(l, "set "):
			// set -e…, set +e… (errexit among other one-letter options)
			if f := strings.Fields(l); len(f) > 1 && len(f[1]) > 1 && f[1][1] != 'o' && strings.ContainsRune(f[1][1:], 'e') {
				errexit = f[1][0] == '-'
			}
		case l == readme:
			ran = true
			// set -e would end the script at the root's failure, before
			// the SDK's half.
			assert.False(t, errexit, ".ci/run runs the README's test command with set +e")
		}
	}
	assert.True(t, ran, ".ci/run runs the README's test command: %s", readme)

	// The command itself, with a go that fails where asked: the SDK's half
	// runs whatever the root's result, and the status is a failure when
	// either half fails.
	fake := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(fake, "go"), []byte(`#!/bin/sh
basename "$PWD" >> "$RUNS"
case " $FAIL " in *" $(basename "$PWD") "*) exit 1 ;; esac
`), 0o755))
	for _, c := range []struct {
		fail string // the directories whose tests fail
		ok   bool
	}{{"", true}, {"root", false}, {"client", false}, {"root client", false}} {
		root := filepath.Join(t.TempDir(), "root")
		require.NoError(t, os.MkdirAll(filepath.Join(root, "client"), 0o755))
		runs := filepath.Join(t.TempDir(), "runs")
		cmd := exec.Command("sh", "-c", readme)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "PATH="+fake+string(os.PathListSeparator)+os.Getenv("PATH"), "RUNS="+runs, "FAIL="+c.fail)
		err := cmd.Run()
		assert.Equal(t, c.ok, err == nil, "failing %q: %v", c.fail, err)
		got, rerr := os.ReadFile(runs)
		require.NoError(t, rerr)
		assert.Equal(t, "root\nclient\n", string(got), "failing %q: both halves run", c.fail)
	}
}
