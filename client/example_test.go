package client_test

import (
	"archive/zip"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"strings"

	"github.com/sandloop/sandloop/client"
)

// In these examples serverURL is the address of a running sandloop
// server, such as "http://127.0.0.1:8080" for `sandloop serve`.

func ExampleClient_Execute() {
	ctx := context.Background()
	c, err := client.New(serverURL, nil) // &client.Options{Token: ...} when the server has tokens
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSession(ctx, s.ID)

	// Globals persist between executions, like cells of a notebook.
	if _, err := c.Execute(ctx, s.ID, "x = 20", nil); err != nil {
		log.Fatal(err)
	}
	r, err := c.Execute(ctx, s.ID, "print('adding'); x + 22", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(r.Stdout)
	fmt.Println(r.Status, r.Text(), r.ExecutionCount)

	// A failing program is a result, not a Go error.
	r, err = c.Execute(ctx, s.ID, "1/0", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.Status, r.Error.Name+":", r.Error.Value)
	// Output:
	// adding
	// ok 42 2
	// error ZeroDivisionError: division by zero
}

func ExampleClient_ExecuteStream() {
	ctx := context.Background()
	c, err := client.New(serverURL, nil)
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSession(ctx, s.ID)

	code := "import time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.01)\n'done'"
	r, err := c.ExecuteStream(ctx, s.ID, code, nil, func(ev client.Event) {
		switch ev.Type {
		case client.EventStdout:
			// A chunk of output can hold several lines (the program's
			// writes may arrive together).
			for _, line := range strings.SplitAfter(ev.Text, "\n") {
				if line != "" {
					fmt.Print("stdout: ", line)
				}
			}
		case client.EventResult:
			fmt.Println("result:", ev.Data["text/plain"])
		case client.EventEnd:
			fmt.Println("end:", ev.Status)
		}
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("aggregated: %q\n", r.Stdout)
	// Output:
	// stdout: step 0
	// stdout: step 1
	// stdout: step 2
	// result: 'done'
	// end: ok
	// aggregated: "step 0\nstep 1\nstep 2\n"
}

func ExampleClient_Upload() {
	ctx := context.Background()
	c, err := client.New(serverURL, nil)
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSession(ctx, s.ID)

	csv := "name,score\nada,3\nbob,4\n"
	if _, err := c.Upload(ctx, s.ID, "data/scores.csv", strings.NewReader(csv)); err != nil {
		log.Fatal(err)
	}
	// The code sees the workspace as its working directory.
	code := `import csv
rows = list(csv.DictReader(open("data/scores.csv")))
open("total.txt", "w").write(str(sum(int(r["score"]) for r in rows)))`
	if _, err := c.Execute(ctx, s.ID, code, nil); err != nil {
		log.Fatal(err)
	}
	total, err := c.ReadFile(ctx, s.ID, "total.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("total:", string(total))

	files, err := c.ListFiles(ctx, s.ID, "")
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range files {
		fmt.Println(f.Type, f.Path)
	}

	_, err = c.ReadFile(ctx, s.ID, "missing.txt")
	fmt.Println("missing:", client.IsNotFound(err))
	// Output:
	// total: 7
	// dir data
	// file total.txt
	// missing: true
}

func ExampleClient_Archive() {
	ctx := context.Background()
	c, err := client.New(serverURL, nil)
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSession(ctx, s.ID)

	if _, err := c.Execute(ctx, s.ID, "import os; os.makedirs('out', exist_ok=True); open('out/a.txt', 'w').write('A')", nil); err != nil {
		log.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := c.Archive(ctx, s.ID, &buf, &client.ArchiveOptions{Format: client.FormatZip}); err != nil {
		log.Fatal(err)
	}
	zr, err := zip.NewReader(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range zr.File {
		fmt.Println(f.Name)
	}
	// Output:
	// out/
	// out/a.txt
}

func ExampleAPIError() {
	ctx := context.Background()
	c, err := client.New(serverURL, nil)
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Execute(ctx, "no-such-session", "1+1", nil)
	var ae *client.APIError
	if errors.As(err, &ae) {
		fmt.Println(ae.StatusCode, ae.Code)
	}
	// Output:
	// 404 not_found
}

func ExampleClient_Fork() {
	ctx := context.Background()
	c, err := client.New(serverURL, nil)
	if err != nil {
		log.Fatal(err)
	}
	// Checkpoints "auto": one before every execution, so Undo reverts a cell.
	s, err := c.CreateSession(ctx, &client.CreateOptions{Checkpoints: "auto"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSession(ctx, s.ID)
	if _, err := c.Execute(ctx, s.ID, "prices = [10, 12, 9]", nil); err != nil {
		log.Fatal(err)
	}
	// A cell that corrupts the data, then undone.
	if _, err := c.Execute(ctx, s.ID, "prices = None", nil); err != nil {
		log.Fatal(err)
	}
	if _, err := c.Undo(ctx, s.ID); err != nil {
		log.Fatal(err)
	}
	r, err := c.Execute(ctx, s.ID, "prices", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("after undo:", r.Text())

	// Two forks try two ideas from the same state; the parent is untouched.
	kids, restored, err := c.Fork(ctx, s.ID, 2, "")
	if err != nil {
		log.Fatal(err)
	}
	// (_ is the last cell's result, as in IPython.)
	fmt.Println("forks:", len(kids), "variables:", restored.Variables)
	for i, code := range []string{"sorted(prices)", "max(prices)"} {
		defer c.DeleteSession(ctx, kids[i].ID)
		r, err := c.Execute(ctx, kids[i].ID, code, nil)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(code, "=", r.Text())
	}
	// Output:
	// after undo: [10, 12, 9]
	// forks: 2 variables: [prices _]
	// sorted(prices) = [9, 10, 12]
	// max(prices) = 12
}

// A session that starts with nothing allowed and is let out to the Python
// package index later, while it runs.
func ExampleClient_UpdateNetwork() {
	ctx := context.Background()
	c, err := client.New(serverURL, nil)
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.CreateSession(ctx, &client.CreateOptions{NetworkMode: "allow", Allow: []string{}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSession(ctx, s.ID)
	fmt.Println(s.NetworkMode, s.Allow)
	s, err = c.UpdateNetwork(ctx, s.ID, []string{"pypi"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.NetworkMode, s.Allow)
	// Output:
	// allow []
	// allow [pypi.org files.pythonhosted.org]
}

// Behind a gateway, a session whose host was lost comes back from its
// latest snapshot under a new id: the client follows the gateway's 307,
// keeps using the old id for the new one, and says what came back.
func ExampleOptions_onRestored() {
	c, err := client.New(serverURL, &client.Options{OnRestored: func(r client.Restore) {
		log.Printf("session %s was restored as %s %s", r.From, r.To, r.Summary)
	}})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSession(ctx, s.ID)
	r, err := c.Execute(ctx, s.ID, "1 + 1", nil) // the same call after a restore
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.Text(), c.SessionID(s.ID) == s.ID) // no restore here: the same id
	// Output: 2 true
}

func ExampleClient_WatchSessionEvents() {
	ctx := context.Background()
	c, err := client.New(serverURL, nil)
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	// What happened to the session so far...
	evs, _, err := c.SessionEvents(ctx, s.ID, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(evs[0].Seq, evs[0].Type, evs[0].State)

	// ...and each transition as it comes, until it closes (watching is
	// no use of it: it neither wakes it nor keeps it open).
	done := make(chan error, 1)
	go func() {
		done <- c.WatchSessionEvents(ctx, s.ID, evs[len(evs)-1].Seq, func(e client.SessionEvent) error {
			fmt.Println(e.Seq, e.Type, e.State, e.Reason)
			return nil
		})
	}()
	if _, err := c.Pause(ctx, s.ID); err != nil {
		log.Fatal(err)
	}
	if err := c.DeleteSession(ctx, s.ID); err != nil {
		log.Fatal(err)
	}
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// 1 created running
	// 2 paused paused asked for
	// 3 closed closed deleted by its owner
}
