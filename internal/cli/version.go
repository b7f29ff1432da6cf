package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is the version of the disker command. Release builds set it with
// -ldflags "-X github.com/diskerhq/disker/internal/cli.Version=v1.2.3";
// otherwise it comes from the module's build information.
var Version = ""

func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the version of disker",
		Long:    "Print the version of disker, and the Go version and platform it was built for.",
		Example: "  disker version",
		Args:    noArgs,
		RunE: runE(func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(a.stdout, versionLine())
			return err
		}),
	}
}

// versionLine is what "disker version" and "disker --version" print.
func versionLine() string {
	return fmt.Sprintf("disker %s (%s %s/%s)", version(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
