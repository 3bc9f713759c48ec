package queue_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldmq/herald/queue"
)

// A prefix search is a range of partitions_name_prefix, in byte
// order and case-sensitive; % and _ are plain characters; keyset paging
// goes on in the same order; search and prefix together are refused.
func TestBrowse_PartitionsByPrefix(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	for _, p := range []string{"Alpha", "al_1", "al%2", "alb", "b", "xal"} {
		push(t, s, "names", p, 1)
	}
	names := func(qry queue.PartitionsQuery) ([]string, int64) {
		t.Helper()
		qry.Queue = "names"
		page, err := s.BrowsePartitions(ctx, qry)
		require.NoError(t, err)
		var out []string
		for _, p := range page.Partitions {
			out = append(out, p.Name)
		}
		return out, page.Matching
	}
	got, n := names(queue.PartitionsQuery{Prefix: "al"})
	assert.Equal(t, []string{"al%2", "al_1", "alb"}, got, "byte order, case-sensitive")
	assert.EqualValues(t, 3, n)
	got, n = names(queue.PartitionsQuery{Prefix: "al_"})
	assert.Equal(t, []string{"al_1"}, got, "_ is no wildcard")
	assert.EqualValues(t, 1, n)
	got, _ = names(queue.PartitionsQuery{Prefix: "al%"})
	assert.Equal(t, []string{"al%2"}, got, "% is no wildcard")
	got, _ = names(queue.PartitionsQuery{Prefix: "Al"})
	assert.Equal(t, []string{"Alpha"}, got)
	got, n = names(queue.PartitionsQuery{Prefix: "al", After: "al%2", Limit: 1})
	assert.Equal(t, []string{"al_1"}, got, "the keyset page after al%2")
	assert.EqualValues(t, 3, n, "the count ignores after")
	got, _ = names(queue.PartitionsQuery{Search: "AL"})
	assert.ElementsMatch(t, []string{"al%2", "al_1", "alb", "Alpha", "xal"}, got, "contains, any case (in the collation's order)")
	_, err := s.BrowsePartitions(ctx, queue.PartitionsQuery{Queue: "names", Prefix: "a", Search: "b"})
	assert.True(t, queue.IsInputError(err), "%v", err)
}

func TestPrefixEnd(t *testing.T) {
	for _, c := range []struct {
		in, want string
		ok       bool
	}{
		{"ab", "ac", true},
		{"p-12", "p-13", true},
		{"a\U0010FFFF", "b", true},
		{"\uD7FF", "\uE000", true},
		{"é", "ê", true},
		{"\U0010FFFF", "", false},
	} {
		got, ok := queue.PrefixEnd(c.in)
		assert.Equal(t, c.ok, ok, "%q", c.in)
		assert.Equal(t, c.want, got, "%q", c.in)
	}
}

// A substring search reads every partition of the queue; a prefix reads
// the index range that matches, with a custom plan and with the generic
// plan a pooled connection keeps. 20,000 partitions prove the plan (the
// range reads a few blocks, the substring thousands); 100,000 took minutes
// on a busy machine and proved nothing more.
func TestPlan_PartitionPrefixSearchIsIndexBacked(t *testing.T) {
	s := newStore(t)
	ctx := ctxBig(t)
	const big = 20000
	fillPartitions(t, s, "big", big)
	require.NoError(t, s.EnsureConsumers(ctx, []queue.Target{{Queue: "big"}}))
	exec(t, s, "VACUUM ANALYZE")
	id, err := s.QueueID(ctx, "big")
	require.NoError(t, err)
	end, _ := queue.PrefixEnd("p1999")

	list := explainCustom(t, s, queue.BrowsePartitionsAllSQL, id, "big", "", "19999", 50, 0, nil, nil, nil)
	count := explainCustom(t, s, queue.CountPartitionsAllSQL, id, "big", "19999", nil, nil, nil)
	t.Logf("contains 19999 over %d partitions: page %v ms, %d blocks; count %v ms, %d blocks",
		big, list["Actual Total Time"], blocks(list), count["Actual Total Time"], blocks(count))
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		list := explainMode(t, s, mode, queue.PrefixPartitionsAllSQL, id, "big", "", "p1999", 50, 0, nil, nil, end)
		count := explainMode(t, s, mode, queue.CountPrefixAllSQL, id, "big", "p1999", nil, nil, end)
		t.Logf("prefix p1999 (%s): page %v ms, %d blocks, %v rows; count %v ms, %d blocks", mode,
			list["Actual Total Time"], blocks(list), list["Actual Rows"], count["Actual Total Time"], blocks(count))
		assert.EqualValues(t, 11, list["Actual Rows"], "p1999 and p19990…p19999")
		assert.Empty(t, scans(list), mode)
		assert.Empty(t, scans(count), mode)
		assert.Contains(t, indexes(list), "partitions_name_prefix", mode)
		assert.Contains(t, indexes(count), "partitions_name_prefix", mode)
		assert.Less(t, blocks(list), int64(300), "%s: the 11 partitions' rows, not the queue's", mode)
		assert.Less(t, blocks(count), int64(20), "%s: the matching index entries", mode)
	}
	assert.Greater(t, blocks(list), int64(big/10), "a substring reads the queue's partitions")
}

// indexes lists the indexes a plan reads.
func indexes(plan map[string]any) []string {
	var out []string
	if name, ok := plan["Index Name"].(string); ok {
		out = append(out, name)
	}
	subs, _ := plan["Plans"].([]any)
	for _, sub := range subs {
		out = append(out, indexes(sub.(map[string]any))...)
	}
	return out
}
