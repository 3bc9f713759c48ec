// Package authtest makes bearer tokens for tests: Sign builds a JWT with
// the claims a test names, signed by any key and algorithm jwx knows
// (HMAC, RSA, ECDSA, Ed25519), with a key id in its header when asked;
// Secret is the HMAC key the tests' servers are given. The auth package's
// own tests, the gateway's and cmd/herald's use it, so a token is built
// one way everywhere.
//
// It starts no goroutine; a token that cannot be built or signed fails the
// test at once (t.Fatalf).
package authtest
