package queue

// Statements of the browse, for the plan tests.
var (
	BrowseQueuesAllSQL         = browseQueuesAll
	QueueTotalsAllSQL          = queueTotalsAll
	BrowsePartitionsAllSQL     = browsePartitionsAll
	CountPartitionsAllSQL      = countPartitionsAll
	PrefixPartitionsAllSQL     = prefixPartitionsAll
	CountPrefixAllSQL          = countPrefixAll
	PrefixEnd                  = prefixEnd
	BrowseLagSQL               = browseLagSQL
	BrowseLeasesSQL            = browseLeasesSQL
	BrowseMessagePartitionsSQL = browseMessagePartitionsSQL
	CandidatesSQL              = candidatesSQL
)
