package diskertest

import "strings"

// maxDiffLines bounds the lines of the texts lineDiff compares (its work
// grows with their product); past it, the texts are shown whole.
const maxDiffLines = 2000

// lineDiff returns the lines of want and got as a diff: "  " before a line
// of both, "- " before a line of want only, "+ " before a line of got
// only, in the order of the texts. It keeps the longest common sequence
// of lines, so that a change of one line in a long text shows as that
// line. Runs of more than 3 common lines are cut to their ends.
func lineDiff(want, got string) []string {
	a, b := strings.Split(want, "\n"), strings.Split(got, "\n")
	if len(a) > maxDiffLines || len(b) > maxDiffLines {
		return append(prefixed("- ", a), prefixed("+ ", b)...)
	}
	// common[i][j] is the length of the longest common sequence of a[i:]
	// and b[j:].
	common := make([][]int, len(a)+1)
	for i := range common {
		common[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				common[i][j] = common[i+1][j+1] + 1
			} else {
				common[i][j] = max(common[i+1][j], common[i][j+1])
			}
		}
	}
	var out []string
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			out = append(out, "  "+a[i])
			i, j = i+1, j+1
		case j == len(b) || i < len(a) && common[i+1][j] >= common[i][j+1]:
			out = append(out, "- "+a[i])
			i++
		default:
			out = append(out, "+ "+b[j])
			j++
		}
	}
	return elide(out)
}

func prefixed(p string, lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = p + l
	}
	return out
}

// elide cuts each run of more than 3 common lines to its first and last
// line around a "  ..." line, so that the changes stand out.
func elide(lines []string) []string {
	var out []string
	for i := 0; i < len(lines); {
		j := i
		for j < len(lines) && strings.HasPrefix(lines[j], "  ") {
			j++
		}
		if j-i > 3 {
			out = append(out, lines[i], "  ...", lines[j-1])
		} else {
			out = append(out, lines[i:j]...)
		}
		if j < len(lines) {
			out = append(out, lines[j])
			j++
		}
		i = j
	}
	return out
}
