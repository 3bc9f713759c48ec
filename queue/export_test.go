package queue

// AckResolveSQL is exported for the plan test.
const AckResolveSQL = ackResolveSQL
