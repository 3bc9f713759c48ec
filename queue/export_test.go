package queue

import "fmt"

// AckResolveSQL is exported for the plan test.
const AckResolveSQL = ackResolveSQL

// PopLockSQL is a wildcard pop's claim statement over one queue by name
// ($1), for the plan tests: parameters as popFilter, $5 group, $6 limit.
var PopLockSQL = fmt.Sprintf(popLockSQL, popFilter(&PopRequest{Queue: "x"}), "")

// PreflightSQL is exported for the plan tests.
const PreflightSQL = preflightSQL
