package gateway

import (
	"bytes"
	"encoding/json"
)

// Push and ack items are read member by member, with names matched byte
// for byte. encoding/json matches struct fields without regard to case,
// so {"Queue": "q"} or "PAYLOAD" were read as queue and payload; the
// reference server (JSON.parse) takes a name as written, and a name spelt
// otherwise is an unknown field, ignored. A map per item would match
// exactly too, but costs a map and its entries per item on the hot path;
// these walk the bytes the decoder has already validated and allocate
// nothing.

// eachMember calls fn with the name and the raw value of each member of
// raw, a JSON object, in order (of two members with one name, the later
// one is seen last, so it wins, as in JSON.parse). A name with escapes is
// given unescaped. It reports false, having called fn for none or some
// members, when raw is not an object: raw is normally a value a decoder
// has validated, but nothing here relies on that to stay in bounds.
func eachMember(raw []byte, fn func(name []byte, value json.RawMessage)) bool {
	s := scanner{b: raw}
	return s.list('{', '}', func() bool {
		name, ok := s.str()
		if !ok {
			return false
		}
		if bytes.IndexByte(name, '\\') >= 0 {
			var n string
			if json.Unmarshal(s.b[s.last:s.i], &n) != nil {
				return false
			}
			name = []byte(n)
		} else {
			name = name[1 : len(name)-1]
		}
		s.space()
		if !s.eat(':') {
			return false
		}
		s.space()
		v, ok := s.value()
		if ok {
			fn(name, v)
		}
		return ok
	})
}

// membersInto reads the members of raw, a JSON object, named names[i]
// into *fields[i], names matched exactly (see eachMember); others are
// ignored. False when raw is not an object.
func membersInto(raw json.RawMessage, names []string, fields ...*json.RawMessage) bool {
	return eachMember(raw, func(name []byte, v json.RawMessage) {
		for i, n := range names {
			if string(name) == n {
				*fields[i] = v
				return
			}
		}
	})
}

// eachElement calls fn with each element of raw, a JSON array, in order;
// false when raw is not an array (as eachMember).
func eachElement(raw []byte, fn func(value json.RawMessage)) bool {
	s := scanner{b: raw}
	return s.list('[', ']', func() bool {
		v, ok := s.value()
		if ok {
			fn(v)
		}
		return ok
	})
}

// scanner steps over JSON text: it finds where values end, it does not
// check them (the decoder that produced the text did).
type scanner struct {
	b    []byte
	i    int
	last int // where the last string read by str began
}

// list steps over the whole text as opening, items separated by commas,
// closing (white space allowed around each), calling item at the start of
// each item to step over it. False when the text is not such a list or
// item returns false.
func (s *scanner) list(opening, closing byte, item func() bool) bool {
	s.space()
	if !s.eat(opening) {
		return false
	}
	s.space()
	if s.eat(closing) {
		return s.end()
	}
	for {
		s.space()
		if !item() {
			return false
		}
		s.space()
		if s.eat(closing) {
			return s.end()
		}
		if !s.eat(',') {
			return false
		}
	}
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end reports whether only white space is left.
func (s *scanner) end() bool {
	s.space()
	return s.i == len(s.b)
}

// str reads a string literal, quotes included.
func (s *scanner) str() ([]byte, bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false
	}
	s.last = s.i
	for j := s.i + 1; j < len(s.b); j++ {
		switch s.b[j] {
		case '\\':
			j++ // the escaped byte cannot end the string
		case '"':
			s.i = j + 1
			return s.b[s.last:s.i], true
		}
	}
	return nil, false
}

// value reads one value of any kind.
func (s *scanner) value() (json.RawMessage, bool) {
	start := s.i
	if s.i >= len(s.b) {
		return nil, false
	}
	switch s.b[s.i] {
	case '"':
		v, ok := s.str()
		return v, ok
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				if _, ok := s.str(); !ok {
					return nil, false
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.i++
					return s.b[start:s.i], true
				}
			}
			s.i++
		}
		return nil, false
	default: // number, true, false, null
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return s.b[start:s.i], s.i > start
			}
			s.i++
		}
		return s.b[start:s.i], s.i > start
	}
}
