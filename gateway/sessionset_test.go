package gateway

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A session set lists what was added and not removed; an add that its
// refusal turns down (a Drain under way) is never listed, so no session
// can start after a Drain listed the set without being drained.
func TestSessionSet_RefusedAddIsNeverListed(t *testing.T) {
	var set sessionSet
	a, b, c := &session{}, &session{}, &session{}
	assert.True(t, set.add(a, nil))
	assert.True(t, set.add(b, func() bool { return false }))
	assert.False(t, set.add(c, func() bool { return true }), "refused: draining")
	assert.ElementsMatch(t, []*session{a, b}, set.list())
	assert.Equal(t, 2, set.len())
	set.remove(a)
	set.remove(c) // never added: nothing happens
	assert.Equal(t, []*session{b}, set.list())
	assert.Equal(t, 1, set.len())
}
