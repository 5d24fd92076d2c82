package jail

import (
	"bytes"
	"context"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	MaybeInit()
	os.Exit(m.Run())
}

func TestSmoke(t *testing.T) {
	var out, errb bytes.Buffer
	r, err := Run(context.Background(), &Config{Path: DefaultPython, Args: []string{"python3", "-c", "import os; print('hi', os.getuid(), os.getcwd()); print(open('/etc/passwd').read())"}, Workspace: t.TempDir(), Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v\nstdout=%s\nstderr=%s", r, out.String(), errb.String())
}
