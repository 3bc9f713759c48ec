package httpapi

import (
	"errors"
	"net/url"
	"strconv"
	"strings"

	"github.com/heraldmq/herald/queue"
)

// IntParam parses an optional integer query parameter; "" gives 0.
func IntParam(v, name string, lo, hi int) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, BadRequestf("%s must be an integer between %d and %d", name, lo, hi)
	}
	return n, nil
}

// ClampedParam parses an optional integer query parameter; "" gives 0,
// values below lo are refused and values above hi become hi.
func ClampedParam(v, name string, lo, hi int) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil && errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(v, "-") {
		return hi, nil
	}
	if err != nil || n < lo {
		return 0, BadRequestf("%s must be an integer of at least %d", name, lo)
	}
	return min(n, hi), nil
}

// BoolParam parses an optional boolean query parameter: "", false or 0,
// true or 1.
func BoolParam(v, name string) (bool, error) {
	switch v {
	case "", "false", "0":
		return false, nil
	case "true", "1":
		return true, nil
	}
	return false, BadRequestf("%s must be true or false", name)
}

// PageParams reads limit (1..MaxBrowseLimit, def when absent) and offset.
func PageParams(q url.Values, def int) (limit, offset int, err error) {
	if limit, err = IntParam(q.Get("limit"), "limit", 1, queue.MaxBrowseLimit); err != nil {
		return 0, 0, err
	}
	if limit == 0 {
		limit = def
	}
	if offset, err = IntParam(q.Get("offset"), "offset", 0, queue.MaxBrowseOffset); err != nil {
		return 0, 0, err
	}
	return limit, offset, nil
}
