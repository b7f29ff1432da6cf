package main

import (
	"context"
	"fmt"
	"net/url"
	"os"

	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/diskerhq/disker/diskerotel"
	"github.com/diskerhq/disker/internal/cli"
)

// tracing is the command's cli.Tracing: diskerotel's Tracer, exporting over
// OTLP/HTTP.
type tracing struct {
	endpoint    string
	serviceName string
	// exporter, when set, replaces the OTLP exporter (tests use an
	// in-memory one).
	exporter sdktrace.SpanExporter
	// syncExport exports each span as it ends instead of in batches
	// (tests, to read the spans as soon as they end).
	syncExport bool
}

// Flags registers --otlp-endpoint and --service-name.
func (t *tracing) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&t.endpoint, "otlp-endpoint", "", "export trace spans over OTLP/HTTP to this URL (e.g. http://127.0.0.1:4318); empty: OTEL_EXPORTER_OTLP_ENDPOINT, or no tracing")
	fs.StringVar(&t.serviceName, "service-name", "", `service.name of the spans (default "disker-worker" or "disker-gateway"; OTEL_SERVICE_NAME also works)`)
}

// Start returns a diskerotel.Tracer on a tracer provider that exports over
// OTLP/HTTP, or no Tracer when no endpoint is set.
func (t *tracing) Start(ctx context.Context, command string) (cli.Tracer, func(context.Context) error, error) {
	exp := t.exporter
	if exp == nil {
		var opts []otlptracehttp.Option
		switch {
		case t.endpoint != "":
			u, err := url.Parse(t.endpoint)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return nil, nil, fmt.Errorf("invalid --otlp-endpoint %q: want a URL such as http://127.0.0.1:4318", t.endpoint)
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u.JoinPath("v1/traces").String()))
		case os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "":
			return nil, func(context.Context) error { return nil }, nil
		}
		var err error
		if exp, err = otlptracehttp.New(ctx, opts...); err != nil {
			return nil, nil, fmt.Errorf("tracing: %w", err)
		}
	}
	name := t.serviceName
	if name == "" {
		name = os.Getenv("OTEL_SERVICE_NAME")
	}
	if name == "" {
		name = "disker-" + command
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(name)))
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: %w", err)
	}
	sp := sdktrace.NewBatchSpanProcessor(exp)
	if t.syncExport {
		sp = sdktrace.NewSimpleSpanProcessor(exp)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sp), sdktrace.WithResource(res))
	return diskerotel.New(diskerotel.WithTracerProvider(tp)), tp.Shutdown, nil
}
