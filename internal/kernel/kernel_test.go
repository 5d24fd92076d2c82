package kernel

import (
	"context"
	"testing"
)

func TestHostBasic(t *testing.T) {
	k := startHost(t, nil, nil)
	for _, code := range []string{"1+1", "2+2", "print(3)"} {
		r, err := k.Execute(context.Background(), Request{Code: code, Timeout: 3e9}, func(e Event) { t.Logf("%+v", e) })
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v", r)
	}
}
