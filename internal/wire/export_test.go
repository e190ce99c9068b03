package wire

// ParseFast and ParseSlow expose ParseObject's two paths to the
// differential fuzz test.
var (
	ParseFast = parseFast
	ParseSlow = parseSlow
)
