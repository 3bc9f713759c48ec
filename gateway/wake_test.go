package gateway

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestWakeBoard(t *testing.T) {
	b := wakeBoard{chans: map[string]*wakeEntry{}}
	ch1, leave1 := b.wait("q")
	ch2, leave2 := b.wait("q")
	any, leaveAny := b.wait("")
	b.notify("q")
	for _, ch := range []<-chan struct{}{ch1, ch2, any} {
		select {
		case <-ch:
		default:
			t.Fatal("a push to q wakes q's waiters and namespace waiters")
		}
	}
	leave1()
	leave2()
	leaveAny()
	assert.Empty(t, b.chans)

	// Waiters that leave without a push leave nothing behind.
	_, leave := b.wait("never-pushed")
	other, leaveOther := b.wait("other")
	leave()
	assert.NotContains(t, b.chans, "never-pushed")
	b.notify("unrelated")
	select {
	case <-other:
		t.Fatal("a push to another queue does not wake q")
	default:
	}
	leaveOther()
	assert.Empty(t, b.chans)
}
