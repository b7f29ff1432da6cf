// Package browsertest tests the dashboard (internal/dashboard, served by
// "disker dashboard") in a real headless Chromium, driven with chromedp,
// against a private redis-server and real "disker worker" processes.
//
// It is a module of its own so that chromedp stays out of the library's
// go.mod. Chromium must be installed ("make deps" installs Debian's chromium);
// the tests fail, not skip, without it. Set DISKER_SCREENSHOTS to a directory
// (such as ../docs) to write the screenshots of the docs there.
package browsertest
