package main

import (
	"strings"
	"testing"
)

// oldMD and newMD are two harnesses' outputs: the new one renamed a column,
// added a row and a table.
const oldMD = `## Results

Command: ...

### Disker over Redis: fire-and-forget, 8 producers

Notes with a | in them.

| implementation | msgs/s, median (min–max) | × Disker time | redis CPU µs/msg | met |
| --- | ---: | ---: | ---: | --- |
| disker | 40,000 (39,000–41,000) | 1.00× | 15.0 | yes |
| bare list, rueidis | 25,000 (24,000–26,000) | 1.60× | 25.0 | **no** |

### Disker over Redis: request/reply

| requesters | implementation | p50 µs |
| ---: | --- | ---: |
| 1 | disker | 200 |
| 32 | disker | 1,100 |

Total time: 1s.

`

const newMD = `### Disker over Redis: fire-and-forget, 8 producers

| implementation | msgs/s, median (min–max) | × Disker time | server CPU µs/msg | met |
| --- | ---: | ---: | ---: | --- |
| disker | 50,000 (49,000–51,000) | 1.00× | 12.0 | yes |
| bare list, rueidis | 25,000 (24,000–26,000) | 2.00× | 25.0 | **no** |
| River (PostgreSQL) | 4,000 (4,000–4,000) | 12.5× | 200 | – |

### Disker over Redis: request/reply

| requesters | implementation | p50 µs |
| ---: | --- | ---: |
| 1 | disker | 100 |
| 32 | disker | 1,100 |

### Work per message and per round trip, counted

| workload | implementation | Go allocs/op |
| --- | --- | ---: |
| fire-and-forget | disker | 15.8 |
`

func TestFigures(t *testing.T) {
	fs := figures(parseTables(oldMD))
	for k, want := range map[figKey]float64{
		{"Disker over Redis: fire-and-forget, 8 producers", "disker", "msgs/s, median (min–max)"}:  40000,
		{"Disker over Redis: fire-and-forget, 8 producers", "disker", "server CPU µs/msg"}:         15,
		{"Disker over Redis: fire-and-forget, 8 producers", "bare list, rueidis", "× Disker time"}: 1.6,
		{"Disker over Redis: request/reply", "32 / disker", "p50 µs"}:                              1100,
	} {
		if got, ok := fs.vals[k]; !ok || got != want {
			t.Errorf("%v = %v (found %v), want %v", k, got, ok, want)
		}
	}
	if len(fs.vals) != 8 {
		t.Errorf("%d figures, want 8 (the cells that start with a number): %v", len(fs.vals), fs.vals)
	}
}

func TestRender(t *testing.T) {
	old := []figSet{figures(parseTables(oldMD)), figures(parseTables(oldMD))}
	nw := []figSet{figures(parseTables(newMD)), figures(parseTables(strings.ReplaceAll(newMD, "50,000 (", "60,000 (")))}
	out := render(old, nw)
	for _, want := range []string{
		"| disker | msgs/s, median (min–max) | 40000 | 55000 | 1.38 | 1.25–1.50 |",
		"| disker | server CPU µs/msg | 15.0 | 12.0 | 0.80 | 0.80–0.80 |",
		"| 1 / disker | p50 µs | 200 | 100 | 0.50 | 0.50–0.50 |",
		`Only in the new harness's tables: "Disker over Redis: fire-and-forget, 8 producers": River (PostgreSQL); the table "Work per message and per round trip, counted".`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the comparison lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Only in the old") {
		t.Errorf("every old figure has a new one:\n%s", out)
	}
}

func TestKeyCells(t *testing.T) {
	for _, tc := range []struct {
		rows [][]string
		want int
	}{
		{[][]string{{"a", "1"}, {"b", "1"}}, 1},
		{[][]string{{"1", "a", "5"}, {"1", "b", "5"}, {"32", "a", "6"}}, 2},
		{[][]string{{"1", "4", "9"}, {"8", "4", "9"}, {"1", "64", "9"}}, 2},
		{[][]string{{"1", "a", "5"}, {"32", "a", "6"}}, 2},
		{[][]string{{"x"}, {"x"}}, 1},
	} {
		if got := keyCells(tc.rows); got != tc.want {
			t.Errorf("keyCells(%v) = %d, want %d", tc.rows, got, tc.want)
		}
	}
}
