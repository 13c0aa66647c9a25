package waiter

import (
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// The daemon computes each request's digest over the bytes it receives, and the differential
// tests compare the two waiters' requests byte for byte, so bodies are written as Python's
// json.dumps writes them: ", " and ": " separators, ASCII only (\uXXXX, lowercase), and bytes
// that are not UTF-8 as the lone surrogates \udc80-\udcff that Python's surrogateescape makes.

// Object is a JSON object whose keys keep their order, as a Python dict does.
type Object []Field

// Field is one key and value of an Object.
type Field struct {
	Key   string
	Value any
}

// Get returns the value of key (the first such field) and whether it is there.
func (o Object) Get(key string) (any, bool) {
	for _, f := range o {
		if f.Key == key {
			return f.Value, true
		}
	}
	return nil, false
}

// Set replaces key's value where it is, or appends it, as a dict assignment does.
func (o *Object) Set(key string, value any) {
	for i := range *o {
		if (*o)[i].Key == key {
			(*o)[i].Value = value
			return
		}
	}
	*o = append(*o, Field{key, value})
}

// Dumps encodes v as json.dumps(v) does.
func Dumps(v any) []byte {
	return appendJSON(nil, v)
}

func appendJSON(out []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(out, "null"...)
	case bool:
		if x {
			return append(out, "true"...)
		}
		return append(out, "false"...)
	case int:
		return strconv.AppendInt(out, int64(x), 10)
	case int64:
		return strconv.AppendInt(out, x, 10)
	case float64:
		return appendFloat(out, x)
	case string:
		return appendString(out, x)
	case []byte:
		return appendString(out, string(x))
	case []string:
		out = append(out, '[')
		for i, s := range x {
			if i > 0 {
				out = append(out, ", "...)
			}
			out = appendString(out, s)
		}
		return append(out, ']')
	case []any:
		out = append(out, '[')
		for i, item := range x {
			if i > 0 {
				out = append(out, ", "...)
			}
			out = appendJSON(out, item)
		}
		return append(out, ']')
	case Object:
		out = append(out, '{')
		for i, f := range x {
			if i > 0 {
				out = append(out, ", "...)
			}
			out = appendString(out, f.Key)
			out = append(out, ": "...)
			out = appendJSON(out, f.Value)
		}
		return append(out, '}')
	}
	panic(fmt.Sprintf("pyjson: cannot encode %T", v))
}

func appendFloat(out []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(out, "NaN"...)
	case math.IsInf(f, 1):
		return append(out, "Infinity"...)
	case math.IsInf(f, -1):
		return append(out, "-Infinity"...)
	case f == math.Trunc(f) && math.Abs(f) < 1e16:
		return strconv.AppendFloat(out, f, 'f', 1, 64)
	}
	return strconv.AppendFloat(out, f, 'g', -1, 64)
}

const hexDigits = "0123456789abcdef"

func appendU(out []byte, r rune) []byte {
	return append(out, '\\', 'u', hexDigits[r>>12&15], hexDigits[r>>8&15], hexDigits[r>>4&15], hexDigits[r&15])
}

// appendString writes s (bytes, as Python's surrogateescape would have decoded them) quoted.
func appendString(out []byte, s string) []byte {
	out = append(out, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			i++
			switch c {
			case '"':
				out = append(out, '\\', '"')
			case '\\':
				out = append(out, '\\', '\\')
			case '\n':
				out = append(out, '\\', 'n')
			case '\r':
				out = append(out, '\\', 'r')
			case '\t':
				out = append(out, '\\', 't')
			case '\b':
				out = append(out, '\\', 'b')
			case '\f':
				out = append(out, '\\', 'f')
			default:
				if c < 0x20 {
					out = appendU(out, rune(c))
				} else {
					out = append(out, c)
				}
			}
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			out = appendU(out, 0xdc00+rune(c)) // surrogateescape's lone surrogate
			i++
			continue
		}
		i += size
		if r > 0xffff {
			r -= 0x10000
			out = appendU(out, 0xd800+(r>>10))
			out = appendU(out, 0xdc00+(r&0x3ff))
			continue
		}
		out = appendU(out, r)
	}
	return append(out, '"')
}
