package embedded

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Exit statuses of RunCommand.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

const commandUsage = `usage:
  computed iam create-key --tenant T --identity I --role owner|admin|member|viewer
                          [--kind user|service|agent] [--mfa] [--agent A [--confirm ACTION ...]]
  computed iam revoke-key --key-id K
  computed iam list-keys [--tenant T]
  computed iam set-role --tenant T --identity I --role owner|admin|member|viewer

create-key prints the new API key as the last line of its output; it is
shown once and stored only as a hash.
`

// RunCommand runs one operator command (args without "iam"): create-key,
// revoke-key or list-keys. It returns the exit status: 0 done, 1 failed,
// 2 usage error.
func RunCommand(ctx context.Context, svc *Service, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, commandUsage)
		return exitUsage
	}
	switch args[0] {
	case "create-key":
		return createKeyCommand(ctx, svc, args[1:], stdout, stderr)
	case "revoke-key":
		return revokeKeyCommand(ctx, svc, args[1:], stdout, stderr)
	case "list-keys":
		return listKeysCommand(ctx, svc, args[1:], stdout, stderr)
	case "set-role":
		return setRoleCommand(ctx, svc, args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, commandUsage)
		return exitOK
	}
	fmt.Fprintf(stderr, "iam: unknown command %q\n%s", args[0], commandUsage)
	return exitUsage
}

// actionList collects --confirm values; each may also be a comma-separated
// list.
type actionList []string

func (a *actionList) String() string { return strings.Join(*a, ",") }

func (a *actionList) Set(v string) error {
	for part := range strings.SplitSeq(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*a = append(*a, part)
		}
	}
	return nil
}

func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("iam "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, commandUsage) }
	return fs
}

// parseFlags parses args, handing words that are not flags to positional
// (which refuses them by returning false). The flag package stops at the
// first such word; parsing resumes after it, so that
// "--confirm A B --mfa" reads B as a second action and --mfa as a flag.
func parseFlags(fs *flag.FlagSet, args []string, positional func(string) bool) error {
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return errReported // the flag package printed it, and the usage
		}
		rest := fs.Args()
		i := 0
		for i < len(rest) && (rest[i] == "-" || !strings.HasPrefix(rest[i], "-")) {
			if positional == nil || !positional(rest[i]) {
				return fmt.Errorf("unexpected argument %q", rest[i])
			}
			i++
		}
		if i == len(rest) {
			return nil
		}
		if i == 0 { // only after "--": a flag-looking word meant as an argument
			return fmt.Errorf("unexpected argument %q", rest[0])
		}
		args = rest[i:]
	}
}

// errReported is a usage error already written to stderr.
var errReported = errors.New("usage error reported")

// usageError reports a parse or validation problem and answers exit 2;
// -h answers the usage and 0.
func usageError(stderr io.Writer, err error) int {
	switch {
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.Is(err, errReported):
	case strings.HasPrefix(err.Error(), "iam: "):
		fmt.Fprintln(stderr, err)
	default:
		fmt.Fprintf(stderr, "iam: %v\n", err)
	}
	return exitUsage
}

func createKeyCommand(ctx context.Context, svc *Service, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("create-key", stderr)
	var req KeyRequest
	var confirm actionList
	fs.StringVar(&req.Tenant, "tenant", "", "tenant `id` (created when absent)")
	fs.StringVar(&req.Identity, "identity", "", "identity `id` (created when absent)")
	fs.StringVar(&req.Role, "role", "", "role of the identity in the tenant: owner, admin, member, viewer")
	fs.StringVar(&req.Kind, "kind", "", "kind of a new identity: user (default), service, agent")
	fs.BoolVar(&req.MFA, "mfa", false, "mark the key as an MFA session")
	fs.StringVar(&req.Agent, "agent", "", "agent `id`: the key is a delegation to this agent")
	fs.Var(&confirm, "confirm", "`action` the agent must have confirmed (repeatable)")
	err := parseFlags(fs, args, func(word string) bool {
		// Words after --confirm are further actions.
		if len(confirm) == 0 {
			return false
		}
		confirm = append(confirm, word)
		return true
	})
	if err != nil {
		return usageError(stderr, err)
	}
	req.Confirm = confirm
	if err := req.Validate(); err != nil {
		return usageError(stderr, err)
	}
	token, keyID, err := svc.CreateKey(ctx, req)
	if err != nil {
		fmt.Fprintf(stderr, "iam: create-key: %v\n", err)
		return exitFailure
	}
	what := "key"
	if req.Agent != "" {
		what = "agent key for " + req.Agent + " on behalf of"
	}
	fmt.Fprintf(stdout, "created %s %s in tenant %s, role %s, key id %s; the key below is shown once:\n",
		what, req.Identity, req.Tenant, req.Role, keyID)
	fmt.Fprintln(stdout, token)
	return exitOK
}

func revokeKeyCommand(ctx context.Context, svc *Service, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("revoke-key", stderr)
	var keyID string
	fs.StringVar(&keyID, "key-id", "", "`id` of the key to revoke")
	if err := parseFlags(fs, args, nil); err != nil {
		return usageError(stderr, err)
	}
	if !keyIDPattern.MatchString(keyID) {
		return usageError(stderr, errors.New("--key-id must be a key id (16 characters, as list-keys shows)"))
	}
	if err := svc.RevokeKey(ctx, keyID); err != nil {
		fmt.Fprintf(stderr, "iam: revoke-key: %v\n", err)
		return exitFailure
	}
	fmt.Fprintf(stdout, "revoked key %s\n", keyID)
	return exitOK
}

func listKeysCommand(ctx context.Context, svc *Service, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("list-keys", stderr)
	var tenant string
	fs.StringVar(&tenant, "tenant", "", "only the keys of this tenant `id`")
	if err := parseFlags(fs, args, nil); err != nil {
		return usageError(stderr, err)
	}
	if tenant != "" && !tenantPattern.MatchString(tenant) {
		return usageError(stderr, errors.New("tenant must be 1 to 128 characters of A-Z a-z 0-9 . _ : -"))
	}
	keys, err := svc.ListKeys(ctx, tenant)
	if err != nil {
		fmt.Fprintf(stderr, "iam: list-keys: %v\n", err)
		return exitFailure
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY ID\tTENANT\tIDENTITY\tKIND\tROLE\tMFA\tAGENT\tCONFIRM\tCREATED\tREVOKED")
	for _, k := range keys {
		revoked := "-"
		if k.RevokedAt != nil {
			revoked = k.RevokedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%t\t%s\t%s\t%s\t%s\n",
			k.KeyID, k.Tenant, k.Identity, k.IdentityKind, orDash(k.Role), k.MFA, orDash(k.AgentID),
			orDash(strings.Join(k.ConfirmActions, ",")), k.CreatedAt.UTC().Format(time.RFC3339), revoked)
	}
	if err := tw.Flush(); err != nil {
		fmt.Fprintf(stderr, "iam: list-keys: %v\n", err)
		return exitFailure
	}
	return exitOK
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func setRoleCommand(ctx context.Context, svc *Service, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("set-role", stderr)
	var tenant, identity, role string
	fs.StringVar(&tenant, "tenant", "", "tenant `id`")
	fs.StringVar(&identity, "identity", "", "identity `id` (of that tenant)")
	fs.StringVar(&role, "role", "", "the new role: owner, admin, member, viewer")
	if err := parseFlags(fs, args, nil); err != nil {
		return usageError(stderr, err)
	}
	if !tenantPattern.MatchString(tenant) || identity == "" || parseRole(role) == roleNone {
		return usageError(stderr, errors.New("set-role needs --tenant, --identity and --role owner|admin|member|viewer"))
	}
	old, err := svc.SetRole(ctx, tenant, identity, role)
	if err != nil {
		fmt.Fprintf(stderr, "iam: set-role: %v\n", err)
		return exitFailure
	}
	if old == "" {
		old = "none"
	}
	fmt.Fprintf(stdout, "role of %s in tenant %s: %s -> %s (keys in use take it within 30 s)\n", identity, tenant, old, role)
	return exitOK
}
