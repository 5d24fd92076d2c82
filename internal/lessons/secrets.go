package lessons

import (
	"regexp"
	"strings"
)

// Lessons outlive runs and are shown to later runs (and, on a server, kept
// in a database others administer), so nothing that looks like a
// credential may enter one.
var secretPatterns = []*regexp.Regexp{
	// key=value and key: value where the key names a secret.
	regexp.MustCompile(`(?i)\b([\w-]*(?:api[_-]?key|secret|token|passw(?:or)?d|pwd|auth|credential|private[_-]?key)[\w-]*)(\s*[:=]\s*|["']\s*[:=]\s*["']?)([^\s'",;}{)]+)`),
	// Authorization headers.
	regexp.MustCompile(`(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}`),
	// Well-known token shapes: OpenAI/Anthropic sk-..., GitHub, Slack, AWS, Google, JWT.
	regexp.MustCompile(`\b(?:sk|pk|rk)-[A-Za-z0-9_-]{12,}`),
	regexp.MustCompile(`\bgh[pousr]_[A-Za-z0-9]{20,}`),
	regexp.MustCompile(`\bxox[abposr]-[A-Za-z0-9-]{10,}`),
	regexp.MustCompile(`\b(?:AKIA|ASIA)[A-Z0-9]{16}\b`),
	regexp.MustCompile(`\bAIza[0-9A-Za-z_-]{30,}`),
	regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}`),
	// Credentials inside URLs.
	regexp.MustCompile(`://[^/\s:@]+:[^/\s@]+@`),
	// Any long run of key-like characters (hex, base64): high entropy.
	regexp.MustCompile(`\b[A-Za-z0-9+/_-]{32,}={0,2}`),
}

// StripSecrets replaces what looks like a key, token or password in s with
// "<redacted>".
func StripSecrets(s string) string {
	for i, re := range secretPatterns {
		switch i {
		case 0:
			s = re.ReplaceAllString(s, "$1$2<redacted>")
		case 8:
			s = re.ReplaceAllString(s, "://<redacted>@")
		default:
			s = re.ReplaceAllStringFunc(s, func(m string) string {
				if i == len(secretPatterns)-1 && !mixed(m) {
					return m // a long plain word or number is not a key
				}
				return "<redacted>"
			})
		}
	}
	return s
}

// mixed says whether s mixes letters and digits, as generated keys do.
func mixed(s string) bool {
	return strings.ContainsAny(s, "0123456789") && strings.IndexFunc(s, func(r rune) bool {
		return (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
	}) >= 0
}
