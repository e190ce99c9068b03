package gogen

import (
	"strings"
	"unicode"
)

// initialisms are written in capitals in Go names, as golint expects.
var initialisms = map[string]string{
	"Id": "ID", "Ids": "IDs", "Url": "URL", "Ip": "IP", "Ttl": "TTL", "Mfa": "MFA",
	"Json": "JSON", "Http": "HTTP", "Iam": "IAM", "Api": "API", "Cpu": "CPU", "Gpu": "GPU",
	"Ok": "OK",
}

// exported turns a lowerCamelCase catalog name into an exported Go name.
func exported(name string) string {
	words := splitCamel(name)
	var b strings.Builder
	for _, w := range words {
		w = strings.ToUpper(w[:1]) + w[1:]
		if r, ok := initialisms[w]; ok {
			w = r
		}
		b.WriteString(w)
	}
	return b.String()
}

// unexported is exported with its first word, initialism or not, in
// lowercase: "IDField" -> "idField", "ids" -> "ids", "iamRegion" -> "iamRegion".
func unexported(name string) string {
	first := splitCamel(name)[0]
	return strings.ToLower(first) + strings.TrimPrefix(exported(name), exported(first))
}

func splitCamel(s string) []string {
	var words []string
	start := 0
	rs := []rune(s)
	for i := 1; i < len(rs); i++ {
		if unicode.IsUpper(rs[i]) && !unicode.IsUpper(rs[i-1]) {
			words = append(words, string(rs[start:i]))
			start = i
		}
	}
	return append(words, string(rs[start:]))
}
