package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwt"

	"github.com/heraldmq/herald/auth"
)

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return fmt.Sprint(*l) }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// runToken signs a development token with the HMAC secret Herald is
// configured with (--secret, else HERALD_AUTH_SECRET), with a role and,
// when any is given, the rights of the herald claim. For development and
// tests: production tokens come from an identity provider.
func runToken(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("herald token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	secret := fs.String("secret", "", "HMAC secret to sign with (default $HERALD_AUTH_SECRET)")
	sub := fs.String("sub", "", "subject: who the bearer is (stamped on the messages it pushes)")
	role := fs.String("role", "read-only", "read-only, read-write or admin")
	ttl := fs.Duration("ttl", time.Hour, "lifetime (exp = now + ttl); 0 for a token that never expires")
	issuer := fs.String("iss", "", "issuer claim (for --auth-issuer)")
	audience := fs.String("aud", "", "audience claim (for --auth-audience)")
	var consume, produce, namespaces listFlag
	fs.Var(&consume, "consume", "a queue or queue/partition pattern it may consume (repeatable; * matches any run)")
	fs.Var(&produce, "produce", "a queue or queue/partition pattern it may produce to (repeatable)")
	fs.Var(&namespaces, "namespace", "a namespace or namespace/task pattern it may pop by (repeatable)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: herald token [flags]\n\nSigns an HS256 token with Herald's --auth-secret, for development.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	key := *secret
	if key == "" {
		key = os.Getenv("HERALD_AUTH_SECRET")
	}
	if len(key) < 32 {
		return errors.New("give the server's secret (at least 32 bytes) with --secret or HERALD_AUTH_SECRET")
	}
	if _, ok := auth.ParseRole(*role); !ok {
		return errors.New("--role must be read-only, read-write or admin")
	}
	b := jwt.NewBuilder().Subject(*sub).IssuedAt(time.Now()).Claim("role", *role)
	if *ttl > 0 {
		b = b.Expiration(time.Now().Add(*ttl))
	}
	if *issuer != "" {
		b = b.Issuer(*issuer)
	}
	if *audience != "" {
		b = b.Audience([]string{*audience})
	}
	if len(consume)+len(produce)+len(namespaces) > 0 {
		r := auth.Rights{Consume: consume, Produce: produce, Namespaces: namespaces}
		if _, err := auth.ParseRights(mustJSON(r)); err != nil {
			return err
		}
		b = b.Claim("herald", r)
	}
	t, err := b.Build()
	if err != nil {
		return err
	}
	out, err := jwt.Sign(t, jwt.WithKey(jwa.HS256(), []byte(key)))
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, string(out))
	return err
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // a struct of strings always marshals
	}
	return b
}
