package jobs

// validJSON reports whether b is one JSON value with optional white space around it, exactly
// as json.Valid does (FuzzValidJSON holds the two together), in one pass: the bytes of a
// string are skipped in a tight loop rather than fed one by one to a state function. Every
// line submit reads and every job a worker decodes is checked, and a prompt is most of a
// line: json.Valid cost a worker about 7,000 instructions per job (bench comparison 2).
func validJSON(b []byte) bool {
	var open [64]byte
	stack := open[:0] // '{' or '[' for each container not yet closed
	i := skipWS(b, 0)
	for {
		// A value starts at b[i].
		if i >= len(b) {
			return false
		}
		switch c := b[i]; {
		case c == '{' || c == '[':
			if len(stack) == maxJSONNesting {
				return false
			}
			i = skipWS(b, i+1)
			if i < len(b) && b[i] == c+2 { // '}' or ']': empty
				i++
				break
			}
			stack = append(stack, c)
			if c == '{' {
				if i = memberValue(b, i); i < 0 {
					return false
				}
			}
			continue
		case c == '"':
			i = jsonStringEnd(b, i)
		case c == '-' || '0' <= c && c <= '9':
			i = jsonNumberEnd(b, i)
		case c == 't':
			i = literalEnd(b, i, "true")
		case c == 'f':
			i = literalEnd(b, i, "false")
		case c == 'n':
			i = literalEnd(b, i, "null")
		default:
			return false
		}
		if i < 0 {
			return false
		}
		// After a value: close containers, or go on to the next element or member.
		for {
			i = skipWS(b, i)
			if len(stack) == 0 {
				return i == len(b)
			}
			if i >= len(b) {
				return false
			}
			top := stack[len(stack)-1]
			if b[i] == top+2 { // '}' or ']'
				stack = stack[:len(stack)-1]
				i++
				continue
			}
			if b[i] != ',' {
				return false
			}
			i = skipWS(b, i+1)
			if top == '{' {
				if i = memberValue(b, i); i < 0 {
					return false
				}
			}
			break
		}
	}
}

// maxJSONNesting is the deepest nesting json.Valid accepts.
const maxJSONNesting = 10000

// memberValue reads an object member's key and colon at b[i] and returns where its value
// starts, or -1.
func memberValue(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = jsonStringEnd(b, i); i < 0 {
		return -1
	}
	i = skipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		return -1
	}
	return skipWS(b, i+1)
}

// jsonStringEnd returns the index just past the string literal that starts at b[i] == '"',
// or -1 when it is not a valid one: unterminated, a control character, or a bad escape.
func jsonStringEnd(b []byte, i int) int {
	for j := i + 1; ; {
		if j = plainEnd(b, j); j >= len(b) {
			return -1
		}
		switch c := b[j]; {
		case c == '"':
			return j + 1
		case c < 0x20:
			return -1
		}
		if j+1 >= len(b) {
			return -1
		}
		switch b[j+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			j += 2
		case 'u':
			if j+6 > len(b) {
				return -1
			}
			for _, h := range b[j+2 : j+6] {
				if !isHex(h) {
					return -1
				}
			}
			j += 6
		default:
			return -1
		}
	}
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// jsonNumberEnd returns the index just past the number that starts at b[i], or -1.
func jsonNumberEnd(b []byte, i int) int {
	if b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return -1
	case b[i] == '0':
		i++
	case '1' <= b[i] && b[i] <= '9':
		i = digitsEnd(b, i+1)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return -1
		}
		i = digitsEnd(b, i)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return -1
		}
		i = digitsEnd(b, i)
	}
	return i
}

// digitsEnd returns the index past the digits from b[i] on.
func digitsEnd(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// literalEnd returns the index past lit at b[i], or -1 when b does not hold it there.
func literalEnd(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}
