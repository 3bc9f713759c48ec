package httpapi

import (
	"encoding/json"
	"testing"
)

// FuzzPlainString: the fast path of StringField reads exactly what
// json.Unmarshal reads, whenever it takes a literal at all.
func FuzzPlainString(f *testing.F) {
	for _, seed := range []string{`"abc"`, `""`, `"a\"b"`, `"\u00e9"`, `"é"`, "\"\xff\"", `"a` + "\t" + `b"`, `1`, `null`, `"`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := PlainString(raw)
		if !ok {
			return
		}
		var want string
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("PlainString took %q, which json.Unmarshal refuses: %v", raw, err)
		}
		if got != want {
			t.Fatalf("PlainString(%q) = %q, json.Unmarshal gives %q", raw, got, want)
		}
	})
}
