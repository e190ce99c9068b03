package bundle

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
)

// Redacted replaces every secret the scrubber finds.
const Redacted = "[REDACTED]"

// Scrubber removes secrets from what goes into a bundle: values it was
// told (the join token, secrets resolved for guests, secret-named
// environment variables), and whatever has the shape of one: PEM blocks,
// bearer and basic credentials, key=value and "key": "value" pairs whose
// key names a secret, credentials in URLs, presigned-URL signatures, and
// the service's own token formats. It errs on the side of removing too
// much: a bundle is read by people who must never see a secret.
type Scrubber struct {
	known []string // longest first, so a value that contains another goes whole
}

// minKnown is the shortest value scrubbed by value: shorter ones ("1",
// "true") would blank out the bundle and are no secret worth the name.
const minKnown = 6

// NewScrubber scrubs values besides the shapes it knows.
func NewScrubber(values ...string) *Scrubber {
	s := &Scrubber{}
	s.Add(values...)
	return s
}

// Add makes the scrubber remove values wherever they appear.
func (s *Scrubber) Add(values ...string) {
	for _, v := range values {
		v = strings.TrimSpace(v)
		if len(v) >= minKnown && !slices.Contains(s.known, v) {
			s.known = append(s.known, v)
		}
	}
	slices.SortFunc(s.known, func(a, b string) int { return len(b) - len(a) })
}

// secretName matches names of keys, variables and flags that hold a
// secret.
var secretName = regexp.MustCompile(`(?i)(pass(word|wd|phrase)?|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|credential|auth(orization)?|cookie|session[_-]?id|signature|bearer|\bpwd\b|keys?\b)`)

// IsSecretName reports whether a key, variable or flag name names a
// secret.
func IsSecretName(name string) bool { return secretName.MatchString(name) }

// secretWords are the words of a name that holds a secret.
const secretWords = `(?:pass(?:word|wd|phrase)?|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|credential|authorization|auth|cookie|signature|pwd)`

var (
	// A PEM block of any type, whole: private keys above all, and
	// certificates too (the rule is simpler than the exceptions).
	pemBlock = regexp.MustCompile(`(?s)-----BEGIN [A-Z0-9 ]+-----.*?(-----END [A-Z0-9 ]+-----|\z)`)
	// Authorization: Bearer x, Basic x, and a bare "bearer x".
	bearer = regexp.MustCompile(`(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}`)
	// key=value, key: value, key="value", "key": "value", and a flag
	// --key value.
	pair = regexp.MustCompile(`(?i)("?[A-Za-z0-9_.-]*` + secretWords + `[A-Za-z0-9_.-]*"?)(\s*[:=]\s*)("[^"]*"|'[^']*'|[^\s,;&"'}\]]+)|(--[A-Za-z0-9-]*` + secretWords + `[A-Za-z0-9-]*)(\s+)("[^"]*"|'[^']*'|[^\s-][^\s]*)`)
	// scheme://user:password@host
	urlUser = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@`)
	// Presigned URLs' and the service's token shapes.
	tokenShapes = regexp.MustCompile(`(?i)(X-Amz-(Signature|Credential|Security-Token)=)[^&\s"']+|\bwhsec_[A-Za-z0-9+/=_-]{8,}|\b(cpk|cjt|cfm)_[A-Za-z0-9_-]{16,}|\bAKIA[0-9A-Z]{16}\b|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}`)
)

// Text scrubs text and says how many secrets it removed.
func (s *Scrubber) Text(b []byte) ([]byte, int) {
	n := 0
	for _, v := range s.known {
		if c := bytes.Count(b, []byte(v)); c > 0 {
			n += c
			b = bytes.ReplaceAll(b, []byte(v), []byte(Redacted))
		}
	}
	replace := func(re *regexp.Regexp, f func(m []byte) []byte) {
		b = re.ReplaceAllFunc(b, func(m []byte) []byte {
			out := f(m)
			if !bytes.Equal(out, m) {
				n++
			}
			return out
		})
	}
	replace(pemBlock, func([]byte) []byte { return []byte(Redacted + " (PEM block)") })
	replace(bearer, func(m []byte) []byte {
		word, _, _ := bytes.Cut(m, []byte(" "))
		return append(append([]byte{}, word...), " "+Redacted...)
	})
	replace(urlUser, func(m []byte) []byte {
		i := bytes.Index(m, []byte("://"))
		return append(append([]byte{}, m[:i+3]...), Redacted+"@"...)
	})
	replace(tokenShapes, func(m []byte) []byte {
		if i := bytes.IndexByte(m, '='); i > 0 && bytes.HasPrefix(bytes.ToLower(m), []byte("x-amz-")) {
			return append(append([]byte{}, m[:i+1]...), Redacted...)
		}
		return []byte(Redacted)
	})
	replace(pair, func(m []byte) []byte {
		sub := pair.FindSubmatchIndex(m)
		vs := 6 // key=value; else --flag value
		if sub[vs] < 0 {
			vs = 12
		}
		val := m[sub[vs]:sub[vs+1]]
		if bytes.Contains(val, []byte(Redacted)) || len(bytes.Trim(val, `"'`)) == 0 {
			return m
		}
		q := ""
		if val[0] == '"' || val[0] == '\'' {
			q = string(val[0])
		}
		return append(append([]byte{}, m[:sub[vs]]...), q+Redacted+q...)
	})
	return b, n
}

// JSON scrubs a JSON document by its structure: the value of a key that
// names a secret, and every value of an environment or user-data map, is
// replaced whole; other strings are scrubbed as text. A document that does
// not parse is scrubbed as text.
func (s *Scrubber) JSON(b []byte) ([]byte, int) {
	var v any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if d.Decode(&v) != nil {
		return s.Text(b)
	}
	n := 0
	v = s.value(v, false, &n)
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return s.Text(b)
	}
	return out, n
}

// wholeMaps are keys whose values are all withheld: a workload's
// environment and user data carry its secrets under any names.
var wholeMaps = map[string]bool{"env": true, "environment": true, "userdata": true, "user_data": true}

func (s *Scrubber) value(v any, secret bool, n *int) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = s.value(e, secret || IsSecretName(k) || wholeMaps[strings.ToLower(k)], n)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = s.value(e, secret, n)
		}
		return x
	case string:
		if secret && x != "" {
			*n++
			return Redacted
		}
		out, c := s.Text([]byte(x))
		*n += c
		return string(out)
	default:
		if secret && x != nil {
			*n++
			return Redacted
		}
		return x
	}
}
