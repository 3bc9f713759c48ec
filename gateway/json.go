package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
	"unicode/utf8"
)

// errorBody is every error answer: {"error": "..."}.
type errorBody struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
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

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Error: msg})
}

// badRequest is a client error raised while reading a request.
type badRequest struct {
	status int
	msg    string
}

func (e *badRequest) Error() string { return e.msg }

func badRequestf(format string, args ...any) error {
	return &badRequest{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// readObject reads the body as one JSON object, keeping each field raw so
// handlers can check types and say which field is wrong.
func readObject(r *http.Request) (map[string]json.RawMessage, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &badRequest{status: http.StatusRequestEntityTooLarge,
				msg: fmt.Sprintf("request body too large (limit %d bytes)", tooBig.Limit)}
		}
		return nil, badRequestf("reading request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, badRequestf("Empty request body")
	}
	if !utf8.Valid(body) {
		// JSON decoding would silently turn bad bytes in names into U+FFFD.
		return nil, badRequestf("Invalid JSON: request body must be UTF-8")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return nil, badRequestf("Invalid JSON: request body must be a JSON object")
		}
		return nil, badRequestf("Invalid JSON: %v", err)
	}
	if obj == nil {
		return nil, badRequestf("Invalid JSON: request body must be a JSON object")
	}
	return obj, nil
}

// isNull reports whether a raw field is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

// stringField reads an optional string field: absent or null gives "", false.
func stringField(obj map[string]json.RawMessage, key string) (string, bool, error) {
	return stringValue(obj[key], key)
}

// stringValue reads an optional string field's raw value: absent or null
// gives "", false.
func stringValue(raw json.RawMessage, key string) (string, bool, error) {
	if isNull(raw) {
		return "", false, nil
	}
	if s, ok := plainString(raw); ok {
		return s, true, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, fmt.Errorf("%s must be a string", key)
	}
	return s, true, nil
}

// plainString reads a JSON string literal with no escapes and valid UTF-8
// (ids, statuses: nearly every string a client sends) without
// json.Unmarshal, which would scan and validate it again. raw comes from a
// document the decoder has validated. Anything else is not ok, for
// json.Unmarshal to read.
func plainString(raw json.RawMessage) (string, bool) {
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

// intField reads an optional integer field.
func intField(obj map[string]json.RawMessage, key string) (int, bool, error) {
	raw := obj[key]
	if isNull(raw) {
		return 0, false, nil
	}
	var n int
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, false, fmt.Errorf("%s must be an integer", key)
	}
	return n, true, nil
}

// arrayField reads a field that must be a JSON array.
func arrayField(obj map[string]json.RawMessage, key string) ([]json.RawMessage, bool) {
	raw := obj[key]
	if isNull(raw) {
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

// objectOf decodes one array element that must be an object.
func objectOf(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, false
	}
	return obj, true
}

// Timestamps as the reference server writes them.
const (
	microTime = "2006-01-02T15:04:05.000000Z" // message createdAt
	milliTime = "2006-01-02T15:04:05.000Z"    // lease expiry, DLQ times
)

func formatMicro(t time.Time) string { return t.UTC().Format(microTime) }
func formatMilli(t time.Time) string { return t.UTC().Format(milliTime) }

// nullable renders "" as JSON null.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
