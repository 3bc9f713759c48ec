package fanoutload

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A child here is a shell that reads its arguments: "ready" when its
// first argument is the second (each child is given its own list), and
// it holds until its stdin closes.
var shellChild = []string{"/bin/sh", "-c", `if [ "$1" = "$2" ]; then echo ready; else echo "error: $1 is not $2"; fi; cat >/dev/null`, "child"}

func TestStartChildren_ReturnsOnceEveryChildIsReadyAndCloseEndsThem(t *testing.T) {
	fp, err := StartChildren(context.Background(), shellChild, [][]string{{"a", "a"}, {"b", "b"}, {"c", "c"}}, io.Discard)
	require.NoError(t, err)
	require.Len(t, fp.procs, 3)
	for _, p := range fp.procs {
		assert.Nil(t, p.cmd.ProcessState, "a child holds until its stdin closes")
	}
	fp.Close()
	for _, p := range fp.procs {
		require.NotNil(t, p.cmd.ProcessState, "Close waits for every child")
		assert.True(t, p.cmd.ProcessState.Success())
	}
}

func TestStartChildren_FailsWhenAChildIsNotReady(t *testing.T) {
	for name, c := range map[string]struct {
		argv []string
		want string
	}{
		"SaysAnError":  {shellChild, "error: x is not y"},
		"EndsBeforeIt": {[]string{"/bin/sh", "-c", "exit 0"}, "ended before it was ready"},
	} {
		t.Run(name, func(t *testing.T) {
			fp, err := StartChildren(context.Background(), c.argv, [][]string{{"x", "x"}, {"x", "y"}}, io.Discard)
			require.Error(t, err)
			assert.Nil(t, fp)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}
