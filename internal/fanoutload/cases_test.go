package fanoutload

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseCases_ReadsCasesAndRefusesBadOnes(t *testing.T) {
	got, err := ParseCases("10000@10, 1000@100")
	require.NoError(t, err)
	assert.Equal(t, []Case{{10000, 10}, {1000, 100}}, got)
	none, err := ParseCases("")
	require.NoError(t, err)
	assert.Empty(t, none)
	for _, bad := range []string{"10000", "x@10", "10@x", "0@10", "10@0", "100001@1", "1@10001"} {
		_, err := ParseCases(bad)
		assert.Error(t, err, bad)
	}
}
