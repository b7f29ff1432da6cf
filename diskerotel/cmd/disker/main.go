// Command disker is the disker command with OpenTelemetry tracing: the same
// commands as github.com/diskerhq/disker/cmd/disker, and the worker and
// gateway commands export the spans of the messages they handle and send
// (see the package diskerotel) to an OTLP/HTTP endpoint given by
// --otlp-endpoint, or by the standard OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT variables. With none of them set it
// traces nothing and exports nothing.
//
// It is built from its own module so that neither the core module nor the
// command of cmd/disker depends on OpenTelemetry:
//
//	go build -o disker ./diskerotel/cmd/disker   # from the repository root: cd diskerotel first
package main

import (
	"os"

	"github.com/diskerhq/disker/internal/cli"
)

func main() {
	os.Exit(cli.MainWith(&tracing{}))
}
