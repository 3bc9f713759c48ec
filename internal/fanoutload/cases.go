package fanoutload

import (
	"fmt"
	"strconv"
	"strings"
)

// Case is one fanout measurement: Followers of one stream, pushes at Rate
// messages per second.
type Case struct {
	Followers int
	Rate      int
}

func (c Case) String() string { return fmt.Sprintf("%d@%d", c.Followers, c.Rate) }

// ParseCases reads the fanout flag of herald-bench and bench/peers:
// "N@R,N@R", followers (1 to 100,000) @ messages per second (1 to 10,000).
// An empty s is no case.
func ParseCases(s string) ([]Case, error) {
	var out []Case
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for f := range strings.SplitSeq(s, ",") {
		n, r, ok := strings.Cut(strings.TrimSpace(f), "@")
		fn, err1 := strconv.Atoi(n)
		fr, err2 := strconv.Atoi(r)
		if !ok || err1 != nil || err2 != nil || fn < 1 || fn > 100000 || fr < 1 || fr > 10000 {
			return nil, fmt.Errorf("%q is not FOLLOWERS@RATE (1-100000 @ 1-10000)", f)
		}
		out = append(out, Case{fn, fr})
	}
	return out, nil
}
