// Command disker runs Disker's dispatcher-worker pattern from the shell:
// workers that serve a receiver with a command or a local HTTP service, an
// HTTP gateway in front of them, sends, stats, dead letters and a demo.
//
// Run "disker --help" for the commands, or read docs/ in the repository.
package main

import (
	"os"

	"github.com/diskerhq/disker/internal/cli"
)

func main() {
	os.Exit(cli.Main())
}
