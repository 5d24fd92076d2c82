package webui

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
)

// TestBrowserLessons lists, searches, adds and deletes lessons in the
// Lessons view, against the real server and SQLite, and never shows
// another token's lessons.
func TestBrowserLessons(t *testing.T) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "runs.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mgr := session.NewManager(&session.ManagerOptions{})
	t.Cleanup(func() { mgr.Close() })
	srv, err := server.New(&server.Options{Manager: mgr, Lessons: st, Tokens: []string{testToken, "other-token-0123456789"}, PublicMounts: Mounts()})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	post := func(token, body string) {
		t.Helper()
		req, _ := http.NewRequest("POST", ts.URL+"/v1/lessons", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 201 {
			t.Fatalf("seed %s: %v %v", body, resp.StatusCode, err)
		}
		resp.Body.Close()
	}
	post(testToken, `{"text":"seaborn is not installed: plot with matplotlib","signature":"ModuleNotFoundError: No module named 'seaborn'","shown":3,"helped":2}`)
	post(testToken, `{"text":"sales.csv's date column is called day","files":"sales.csv#00112233"}`)
	post(testToken, `{"text":"pandas here is 1.5.3: use DataFrame.applymap","shown":4,"recurred":3}`)
	post("other-token-0123456789", `{"text":"someone else's secret lesson"}`)

	p := newPage(t, 1280, 900)
	p.do("open lessons", chromedp.Navigate(ts.URL+"/?token="+testToken+"#/lessons"),
		chromedp.WaitVisible(chromedp.CSS("#lesson-list li.lesson")))
	if got := p.text("#lessons-count"); got != "3 lessons" {
		t.Errorf("count %q", got)
	}
	all := p.text("#lesson-list")
	for _, want := range []string{"seaborn is not installed", "ModuleNotFoundError: No module named <q>", "shown 3 · helped 2 · recurred 0", "sales.csv", "demoted"} {
		if !strings.Contains(all, want) {
			t.Errorf("the list lacks %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "someone else") || strings.Contains(all, "00112233") {
		t.Errorf("the list shows what it should not:\n%s", all)
	}
	if eval[string](p, "document.getElementById('nav-lessons').getAttribute('aria-current')") != "page" {
		t.Error("the Lessons tab is not marked current")
	}
	p.shot("lessons")

	p.do("search", chromedp.SendKeys(chromedp.CSS("#lessons-q"), "matplotlib heatmap"), chromedp.Click(chromedp.CSS("#lessons-search button")),
		chromedp.Poll[chromedp.Void](`document.getElementById('lessons-count').textContent === '1 lesson'`, chromedp.WithPollingTimeout(10*time.Second)))
	if got := p.text("#lesson-list"); !strings.Contains(got, "seaborn") || strings.Contains(got, "sales.csv") {
		t.Errorf("search result:\n%s", got)
	}
	p.do("delete", chromedp.Click(chromedp.CSS(`#lesson-list button[aria-label^="Delete lesson: seaborn"]`)),
		chromedp.WaitVisible(chromedp.CSS("#lesson-list li.empty")))
	eval[string](p, "document.getElementById('lessons-q').value = ''")
	p.do("clear search", chromedp.Click(chromedp.CSS("#lessons-search button")),
		chromedp.Poll[chromedp.Void](`document.getElementById('lessons-count').textContent === '2 lessons'`, chromedp.WithPollingTimeout(10*time.Second)))

	p.do("add", chromedp.SendKeys(chromedp.CSS("#lesson-text"), "the sandbox has no network: use the files given"),
		chromedp.Click(chromedp.CSS("#lesson-add-button")),
		chromedp.Poll[chromedp.Void](`document.getElementById('lessons-count').textContent === '3 lessons'`, chromedp.WithPollingTimeout(10*time.Second)))
	hits, err := st.ListLessons(context.Background(), store.LessonQuery{Owner: server.OwnerOf(testToken), Match: "network"})
	if err != nil || len(hits) != 1 || hits[0].Source != "user" || hits[0].Scope != "global" {
		t.Errorf("the added lesson in the store: %+v %v", hits, err)
	}
	if hits, _ := st.ListLessons(context.Background(), store.LessonQuery{Owner: server.OwnerOf(testToken), Match: "seaborn"}); len(hits) != 0 {
		t.Errorf("the deleted lesson is still stored: %+v", hits)
	}
	p.check(ts.URL)
}
