// Package auth is what a bearer token is, says and may do: the
// verification of JWTs (auth.go: Auth.Verify, with an HMAC secret, a PEM
// public key, or the key set an identity provider publishes, jwks.go),
// the roles (Role), the rights of the herald claim over queues and
// partitions (rights.go), and the cookie rule: what a token that came in
// the cookie alone may do, and which origins a browser's pages may come
// from (cookie.go). It carries a request's verified claims in its context
// (WithClaims, ClaimsFrom) and makes tokens for operators' tooling and
// tests (SignToken).
//
// It never touches the store, answers no request and registers no route,
// and it imports no Herald package. The gateway does those
// (gateway/authorize.go): at the door of each route it finds the token
// (Bearer), applies the cookie rule for what the route does (Effect),
// verifies, compares the role with the route's, answers 401 or 403 and
// counts the failure; it narrows pops and pushes to a token's rights with
// the queue's types (checkConsume, checkProduce), and it hides the ids a
// token may not see by asking the store which partitions they name.
//
// # Concurrency
//
// Auth and Rights are read, never changed, once built: any number of
// requests verify and check at once. Auth makes the keys of Secret and
// PublicKey once, on the first Verify (sync.Once). JWKS.Start refreshes the
// key set every Refresh on a goroutine that ends with its ctx; a Verify
// whose token names a kid the set lacks fetches again on its caller's
// goroutine (10 s at most), no more than once per MinInterval. JWKS.mu
// guards the set and the time of the last fetch and is taken alone, never
// across a fetch.
//
// # Failures
//
// A token that cannot be verified is one of the Err* values (the gateway
// answers 401): none, malformed, a signature or key Herald does not know,
// expired, not yet valid, another issuer or audience, no valid role. A
// verified token below the role a request needs is a RoleError, and a
// request on the cookie alone outside the cookie rule a refusal that says
// what was missing; both wrap ErrForbidden (403). A herald claim of another
// shape is ErrBadRights: a token that says something Herald cannot read
// grants nothing. A JWKS fetch that fails, or answers anything but a
// bounded set of public keys with kids, keeps the last good set, logged
// and counted (herald_auth_jwks_fetches_total{result}); only the first, at
// Start, is fatal: Herald does not start without its keys.
package auth
