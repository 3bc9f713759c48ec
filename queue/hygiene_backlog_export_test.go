package queue

// Statements of the hygiene sample, for the plan tests.
var (
	BacklogSQL     = backlogSQL
	DeadLettersSQL = deadLettersSQL
)
