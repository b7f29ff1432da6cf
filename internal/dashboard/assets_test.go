package dashboard

import (
	"net/http"
	"strings"
	"testing"
)

// TestAssetsAreNotListed: the assets are served one by one; /assets/
// itself is not a directory listing but 404.
func TestAssetsAreNotListed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	for _, path := range []string{"/assets/", "/assets", "/assets/nothing.css", "/assets/%2e%2e/"} {
		if code, _, body := f.get(t, path); code != http.StatusNotFound || strings.Contains(body, "app.js") {
			t.Errorf("GET %s: %d %q, want 404 and no listing", path, code, body)
		}
	}
	for path, kind := range map[string]string{"/assets/app.css": "text/css", "/assets/app.js": "javascript", "/assets/favicon.svg": "image/svg+xml"} {
		if code, h, _ := f.get(t, path); code != http.StatusOK || !strings.Contains(h.Get("Content-Type"), kind) {
			t.Errorf("GET %s: %d %s, want 200 and %s", path, code, h.Get("Content-Type"), kind)
		}
	}
}
