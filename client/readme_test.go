package client_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every ```go block of the README and of docs/*.md (the Go SDK's
// examples live in docs/clients.md) appears, word for word (each
// line's leading and trailing blanks aside, blank lines aside), in a test
// file of this package that holds Example functions, so it compiles and
// (with its Example's Output line) runs against a real Herald. A
// documentation edit that is not made to the Example too, or the other
// way round, fails here.
func TestReadme_GoBlocksAreExamples(t *testing.T) {
	pages, err := filepath.Glob("../docs/*.md")
	require.NoError(t, err)
	pages = append([]string{"../README.md"}, pages...)
	type pageBlock struct {
		page string
		fencedBlock
	}
	var blocks []pageBlock
	inClients := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		require.NoError(t, err)
		for _, blk := range fencedBlocks(string(b), "go") {
			blocks = append(blocks, pageBlock{strings.TrimPrefix(page, "../"), blk})
			if page == "../docs/clients.md" {
				inClients++
			}
		}
	}
	require.Positive(t, inClients, "docs/clients.md has a ```go block (the Go SDK example)")

	files, err := filepath.Glob("*_test.go")
	require.NoError(t, err)
	examples := map[string][]string{} // test file → its normalized lines
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		if strings.Contains(string(b), "\nfunc Example") {
			examples[f] = normalizedLines(string(b))
		}
	}
	require.NotEmpty(t, examples, "client/ has Example test files")

	for _, blk := range blocks {
		want := normalizedLines(blk.text)
		require.NotEmpty(t, want, "%s:%d: an empty ```go block", blk.page, blk.line)
		found := false
		for _, got := range examples {
			if containsRun(got, want) {
				found = true
				break
			}
		}
		if !found {
			// Name the first line no Example file continues the block with,
			// to point at the drift.
			best, bestFile := 0, ""
			for f, got := range examples {
				if n := longestPrefixRun(got, want); n > best {
					best, bestFile = n, f
				}
			}
			if bestFile == "" {
				t.Errorf("%s:%d: no Example test file in client/ contains this ```go block (its first line %q appears in none)",
					blk.page, blk.line, want[0])
				continue
			}
			t.Errorf("%s:%d: the ```go block is not in an Example test file word for word: "+
				"%s matches its first %d lines, then the page has %q", blk.page, blk.line, bestFile, best, want[best])
		}
	}
}

type fencedBlock struct {
	line int // of the opening fence, 1-based
	text string
}

// fencedBlocks returns the fenced code blocks (``` or ~~~) of a markdown
// text whose info string's first word is lang.
func fencedBlocks(md, lang string) []fencedBlock {
	var out []fencedBlock
	lines := strings.Split(md, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimLeft(lines[i], " ")
		fence := ""
		switch {
		case strings.HasPrefix(l, "```"):
			fence = l[:len(l)-len(strings.TrimLeft(l, "`"))]
		case strings.HasPrefix(l, "~~~"):
			fence = l[:len(l)-len(strings.TrimLeft(l, "~"))]
		default:
			continue
		}
		info := strings.Fields(strings.TrimPrefix(l, fence))
		start := i
		var body []string
		for i++; i < len(lines); i++ {
			if c := strings.TrimSpace(lines[i]); strings.HasPrefix(c, fence) && strings.Trim(c, fence[:1]) == "" {
				break
			}
			body = append(body, lines[i])
		}
		if len(info) > 0 && info[0] == lang {
			out = append(out, fencedBlock{line: start + 1, text: strings.Join(body, "\n")})
		}
	}
	return out
}

// normalizedLines are the lines of s without leading and trailing blanks,
// blank lines left out.
func normalizedLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// containsRun reports whether want occurs in got as consecutive lines.
func containsRun(got, want []string) bool {
	return longestPrefixRun(got, want) == len(want)
}

// longestPrefixRun is the most leading lines of want that occur in got as
// consecutive lines.
func longestPrefixRun(got, want []string) int {
	best := 0
	for i := range got {
		n := 0
		for n < len(want) && i+n < len(got) && got[i+n] == want[n] {
			n++
		}
		best = max(best, n)
	}
	return best
}
