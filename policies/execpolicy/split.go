package execpolicy

import (
	"errors"
	"strings"
)

// Split splits a command line into its words the way a POSIX shell does for
// simple commands, without running a shell: words are separated by spaces,
// tabs and newlines; single quotes keep everything up to the next single
// quote as it is; double quotes keep everything up to the next unescaped
// double quote, a backslash escaping '"' and '\' inside them; outside quotes
// a backslash keeps the next character as it is. Nothing else is special:
// no variables, globs, pipes, redirections or "~". It returns an error for
// an unclosed quote, a trailing backslash and a line with no word.
func Split(line string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unclosed single quote")
			}
			w.WriteString(line[i+1 : i+1+j])
			i += 1 + j
			inWord = true
		case c == '"':
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) && (line[i+1] == '"' || line[i+1] == '\\') {
					i++
				}
				w.WriteByte(line[i])
			}
			if i == len(line) {
				return nil, errors.New("unclosed double quote")
			}
			inWord = true
		case c == '\\':
			if i+1 == len(line) {
				return nil, errors.New("trailing backslash")
			}
			i++
			w.WriteByte(line[i])
			inWord = true
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	if len(words) == 0 {
		return nil, errors.New("no command")
	}
	return words, nil
}
