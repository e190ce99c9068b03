// Command computectl is the command line of the compute control plane API:
// one command per registered method of the catalog (gen/cli), built on the
// generated client. See docs/cli.md, or run computectl --help.
//
//	SERVICE_URL=https://compute.example.com SERVICE_TOKEN=... \
//	  computectl sites create --tenant-id acme --kind custom --region eu-west --idempotency-key k1
package main

import (
	"context"
	"io"
	"os"
	"os/signal"

	gencli "computeplane/gen/cli"
	"computeplane/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs computectl with args and returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	return cli.Run(ctx, gencli.Groups, args, getenv, cli.Streams{Stdin: stdin, Stdout: stdout, Stderr: stderr,
		StdinTTY: cli.IsTerminal(stdin), StderrTTY: cli.IsTerminal(stderr)})
}
