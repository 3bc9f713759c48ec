package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
	"unicode/utf8"
)

// errorBody is every error answer: {"error": "..."}.
type errorBody struct {
	Error string `json:"error"`
}

// WriteJSON answers v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	// No HTML escaping: payloads must come back as pushed, and the reference
	// server writes <, > and & as they are. Encode adds a newline the
	// reference does not write.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	body := []byte(`{"error":"encoding response failed"}`)
	if err := enc.Encode(v); err != nil {
		// Only a programming error (an unencodable type) gets here.
		status = http.StatusInternalServerError
	} else {
		body = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// WriteError answers {"error": msg} with status.
func WriteError(w http.ResponseWriter, status int, msg string) {
	WriteJSON(w, status, errorBody{Error: msg})
}

// ReadObject reads the body as one JSON object, keeping each field raw so
// handlers can check types and say which field is wrong. A body over the
// limit of http.MaxBytesReader is a 413.
func ReadObject(r *http.Request) (map[string]json.RawMessage, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, Status(http.StatusRequestEntityTooLarge, fmt.Sprintf("request body too large (limit %d bytes)", tooBig.Limit))
		}
		return nil, BadRequestf("reading request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, BadRequestf("%s", ErrTextEmptyBody)
	}
	if !utf8.Valid(body) {
		// JSON decoding would silently turn bad bytes in names into U+FFFD.
		return nil, BadRequestf("Invalid JSON: request body must be UTF-8")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return nil, BadRequestf("Invalid JSON: request body must be a JSON object")
		}
		return nil, BadRequestf("Invalid JSON: %v", err)
	}
	if obj == nil {
		return nil, BadRequestf("Invalid JSON: request body must be a JSON object")
	}
	return obj, nil
}

// ErrTextEmptyBody is the error of a request with no body where one is
// read.
const ErrTextEmptyBody = "Empty request body"

// IsNull reports whether a raw field is absent or JSON null.
func IsNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

// StringField reads an optional string field: absent or null gives "", false.
func StringField(obj map[string]json.RawMessage, key string) (string, bool, error) {
	return StringValue(obj[key], key)
}

// StringValue reads an optional string field's raw value: absent or null
// gives "", false.
func StringValue(raw json.RawMessage, key string) (string, bool, error) {
	if IsNull(raw) {
		return "", false, nil
	}
	if s, ok := PlainString(raw); ok {
		return s, true, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, fmt.Errorf("%s must be a string", key)
	}
	return s, true, nil
}

// PlainString reads a JSON string literal with no escapes and valid UTF-8
// (ids, statuses: nearly every string a client sends) without
// json.Unmarshal, which would scan and validate it again. raw comes from a
// document the decoder has validated. Anything else is not ok, for
// json.Unmarshal to read.
func PlainString(raw json.RawMessage) (string, bool) {
	n := len(raw)
	if n < 2 || raw[0] != '"' || raw[n-1] != '"' {
		return "", false
	}
	body := raw[1 : n-1]
	if bytes.IndexByte(body, '\\') >= 0 || bytes.IndexByte(body, '"') >= 0 || !utf8.Valid(body) {
		return "", false
	}
	for _, c := range body {
		if c < 0x20 {
			return "", false
		}
	}
	return string(body), true
}

// IntField reads an optional integer field.
func IntField(obj map[string]json.RawMessage, key string) (int, bool, error) {
	raw := obj[key]
	if IsNull(raw) {
		return 0, false, nil
	}
	var n int
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, false, fmt.Errorf("%s must be an integer", key)
	}
	return n, true, nil
}

// ArrayField reads a field that must be a JSON array.
func ArrayField(obj map[string]json.RawMessage, key string) ([]json.RawMessage, bool) {
	raw := obj[key]
	if IsNull(raw) {
		return nil, false
	}
	var arr []json.RawMessage
	if err := json.Unmarshal(raw, &arr); err != nil {
		return nil, false
	}
	if arr == nil {
		arr = []json.RawMessage{}
	}
	return arr, true
}

// ObjectOf decodes one array element that must be an object.
func ObjectOf(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, false
	}
	return obj, true
}

// FromTo reads the optional RFC 3339 times "from" and "to" of a listing.
func FromTo(q url.Values, from, to *time.Time) error {
	for _, f := range []struct {
		name string
		dst  *time.Time
	}{{"from", from}, {"to", to}} {
		if v := q.Get(f.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return BadRequestf("%s must be an RFC3339 time", f.name)
			}
			*f.dst = t
		}
	}
	return nil
}

// Timestamps as the reference server writes them.
const (
	microTime = "2006-01-02T15:04:05.000000Z" // message createdAt
	milliTime = "2006-01-02T15:04:05.000Z"    // lease expiry, DLQ times
)

// FormatMicro writes a message's createdAt: UTC, microseconds.
func FormatMicro(t time.Time) string { return t.UTC().Format(microTime) }

// FormatMilli writes a lease expiry or a DLQ time: UTC, milliseconds.
func FormatMilli(t time.Time) string { return t.UTC().Format(milliTime) }

// Nullable renders "" as JSON null.
func Nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Raw is a stored JSON value (a payload, a trace's data) written as it is;
// empty means null.
type Raw []byte

// MarshalJSON writes r, or null when it is empty.
func (r Raw) MarshalJSON() ([]byte, error) {
	if len(r) == 0 {
		return []byte("null"), nil
	}
	return r, nil
}

// OptTime renders an optional time, or JSON null.
func OptTime(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := FormatMilli(*t)
	return &s
}
