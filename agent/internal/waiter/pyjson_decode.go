package waiter

import (
	"errors"
	"strconv"
	"unicode/utf8"
)

// Loads decodes one JSON document as Python's json.loads does, into nil, bool, int64, float64,
// string, []any and Object. A string's escaped lone surrogate \udcXX becomes the byte XX, as
// Python's surrogateescape writes it out again, so text the daemon passes on reaches the job's
// files as the Python waiter wrote it.
func Loads(data []byte) (any, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("the answer is not UTF-8")
	}
	d := decoder{data: data}
	d.space()
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	d.space()
	if d.pos != len(d.data) {
		return nil, d.fail("Extra data")
	}
	return v, nil
}

type decoder struct {
	data []byte
	pos  int
}

func (d *decoder) fail(what string) error {
	return errors.New(what + ": char " + strconv.Itoa(d.pos))
}

func (d *decoder) space() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *decoder) literal(word string, v any) (any, error) {
	if len(d.data)-d.pos >= len(word) && string(d.data[d.pos:d.pos+len(word)]) == word {
		d.pos += len(word)
		return v, nil
	}
	return nil, d.fail("Expecting value")
}

func (d *decoder) value(depth int) (any, error) {
	if depth > 500 {
		return nil, d.fail("nested too deep")
	}
	if d.pos >= len(d.data) {
		return nil, d.fail("Expecting value")
	}
	switch c := d.data[d.pos]; {
	case c == '{':
		return d.object(depth)
	case c == '[':
		return d.array(depth)
	case c == '"':
		return d.str()
	case c == 'n':
		return d.literal("null", nil)
	case c == 't':
		return d.literal("true", true)
	case c == 'f':
		return d.literal("false", false)
	case c == 'N':
		return d.literal("NaN", nan())
	case c == 'I':
		return d.literal("Infinity", inf(1))
	case c == '-' && d.pos+1 < len(d.data) && d.data[d.pos+1] == 'I':
		d.pos++
		return d.literal("Infinity", inf(-1))
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	}
	return nil, d.fail("Expecting value")
}

func (d *decoder) object(depth int) (any, error) {
	d.pos++
	obj := Object{}
	d.space()
	if d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		return obj, nil
	}
	for {
		d.space()
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return nil, d.fail("Expecting property name enclosed in double quotes")
		}
		key, err := d.str()
		if err != nil {
			return nil, err
		}
		d.space()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return nil, d.fail("Expecting ':' delimiter")
		}
		d.pos++
		d.space()
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		obj.Set(key, v)
		d.space()
		if d.pos < len(d.data) && d.data[d.pos] == ',' {
			d.pos++
			continue
		}
		if d.pos < len(d.data) && d.data[d.pos] == '}' {
			d.pos++
			return obj, nil
		}
		return nil, d.fail("Expecting ',' delimiter")
	}
}

func (d *decoder) array(depth int) (any, error) {
	d.pos++
	list := []any{}
	d.space()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		return list, nil
	}
	for {
		d.space()
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		list = append(list, v)
		d.space()
		if d.pos < len(d.data) && d.data[d.pos] == ',' {
			d.pos++
			continue
		}
		if d.pos < len(d.data) && d.data[d.pos] == ']' {
			d.pos++
			return list, nil
		}
		return nil, d.fail("Expecting ',' delimiter")
	}
}

func (d *decoder) number() (any, error) {
	start := d.pos
	if d.data[d.pos] == '-' {
		d.pos++
	}
	digits := d.pos
	for d.pos < len(d.data) && d.data[d.pos] >= '0' && d.data[d.pos] <= '9' {
		d.pos++
	}
	if d.pos == digits || d.data[digits] == '0' && d.pos-digits > 1 {
		d.pos = start
		return nil, d.fail("Expecting value")
	}
	integer := true
	if d.pos < len(d.data) && d.data[d.pos] == '.' {
		integer = false
		d.pos++
		for d.pos < len(d.data) && d.data[d.pos] >= '0' && d.data[d.pos] <= '9' {
			d.pos++
		}
	}
	if d.pos < len(d.data) && (d.data[d.pos] == 'e' || d.data[d.pos] == 'E') {
		integer = false
		d.pos++
		if d.pos < len(d.data) && (d.data[d.pos] == '+' || d.data[d.pos] == '-') {
			d.pos++
		}
		for d.pos < len(d.data) && d.data[d.pos] >= '0' && d.data[d.pos] <= '9' {
			d.pos++
		}
	}
	text := string(d.data[start:d.pos])
	if integer {
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
			return n, nil
		}
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return nil, d.fail("Expecting value")
	}
	return f, nil
}

func (d *decoder) hex4() (rune, bool) {
	if len(d.data)-d.pos < 4 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(d.data[d.pos:d.pos+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	d.pos += 4
	return rune(n), true
}

func (d *decoder) str() (string, error) {
	d.pos++
	var out []byte
	for {
		if d.pos >= len(d.data) {
			return "", d.fail("Unterminated string")
		}
		c := d.data[d.pos]
		switch {
		case c == '"':
			d.pos++
			return string(out), nil
		case c < 0x20:
			return "", d.fail("Invalid control character")
		case c != '\\':
			out = append(out, c)
			d.pos++
			continue
		}
		d.pos++
		if d.pos >= len(d.data) {
			return "", d.fail("Unterminated string")
		}
		esc := d.data[d.pos]
		d.pos++
		switch esc {
		case '"', '\\', '/':
			out = append(out, esc)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := d.hex4()
			if !ok {
				return "", d.fail("Invalid \\uXXXX escape")
			}
			out = d.appendEscaped(out, r)
		default:
			return "", d.fail("Invalid \\escape")
		}
	}
}

// appendEscaped appends the character of a \uXXXX escape: a surrogate pair as its character,
// a lone \udc80-\udcff as the byte it stands for (surrogateescape).
func (d *decoder) appendEscaped(out []byte, r rune) []byte {
	if r >= 0xd800 && r < 0xdc00 && len(d.data)-d.pos >= 6 && d.data[d.pos] == '\\' && d.data[d.pos+1] == 'u' {
		save := d.pos
		d.pos += 2
		if low, ok := d.hex4(); ok && low >= 0xdc00 && low < 0xe000 {
			return utf8.AppendRune(out, 0x10000+(r-0xd800)<<10+(low-0xdc00))
		}
		d.pos = save
	}
	if r >= 0xdc80 && r <= 0xdcff {
		return append(out, byte(r-0xdc00))
	}
	if r >= 0xd800 && r < 0xe000 {
		// Another lone surrogate: WTF-8, which no valid text holds.
		return append(out, byte(0xe0|r>>12), byte(0x80|(r>>6)&0x3f), byte(0x80|r&0x3f))
	}
	return utf8.AppendRune(out, r)
}
