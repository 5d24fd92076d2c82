package lessons

import (
	"strings"
	"testing"
)

// The fallback's lessons read as rules: the error as Python said it, a
// compact before/after of whole expressions, never the signature's
// placeholders or code cut mid-call.
func TestFallbackReadable(t *testing.T) {
	for _, tt := range []struct {
		c    Candidate
		want string
	}{
		{Candidate{Sig: makeSig("AttributeError", "'DataFrame' object has no attribute 'map'"), Fix: "-c = a.map(str)\n+c = a.applymap(str)"},
			"AttributeError: 'DataFrame' object has no attribute 'map': write `a.applymap` instead of `a.map`."},
		{Candidate{Sig: makeSig("AttributeError", "module 'numpy' has no attribute 'float'"), Fix: "-w = np.array([2, 3, 5]).astype(np.float)\n+w = np.array([2, 3, 5]).astype(float)"},
			"AttributeError: module 'numpy' has no attribute 'float': write `float` instead of `np.float`."},
		{Candidate{Sig: makeSig("KeyError", "'date'"), Files: []string{"sales.csv#abcd"}, Fix: "monthly.py:\n-df = pd.read_csv('sales.csv', parse_dates=['date'])\n+df = pd.read_csv('sales.csv', parse_dates=['day'])"},
			"KeyError: 'date' (sales.csv): write `parse_dates=['day']` instead of `parse_dates=['date']`."},
		{Candidate{Sig: makeSig("ValueError", "bad"), Fix: "-x = f(" + strings.Repeat("a, ", 40) + "...\n+x = g(" + strings.Repeat("b, ", 40) + "..."},
			"ValueError: bad: check this before running the code again."},
		{Candidate{Sig: makeSig("ModuleNotFoundError", "No module named 'seaborn'"), Fact: "The module seaborn is not installed in this sandbox (and there is no network to install it): do without it."},
			"The module seaborn is not installed in this sandbox (and there is no network to install it): do without it."},
	} {
		got := fallback(tt.c)
		if got != tt.want {
			t.Errorf("fallback:\n got %s\nwant %s", got, tt.want)
		}
		if strings.Contains(got, "<q>") || strings.Contains(got, "...") {
			t.Errorf("unreadable: %s", got)
		}
	}
	for _, bad := range []string{"To avoid KeyError: <q>, use <q>", ""} {
		if usable(bad) {
			t.Errorf("usable(%q)", bad)
		}
	}
}
