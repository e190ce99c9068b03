package cli

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

func writeMainHelp(w io.Writer, groups []Group) {
	fmt.Fprintf(w, "%s calls the compute control plane API: one command per served method.\n\n", Program)
	fmt.Fprintf(w, "Usage:\n  %s [global flags] <group> <command> [flags]\n", Program)
	fmt.Fprintf(w, "  %s help [<group> [<command>]]\n\n", Program)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "Commands:")
	fmt.Fprintf(tw, "  login\t%s\n", loginSummary)
	fmt.Fprintf(tw, "  help\tshow help of a group or command\n")
	for _, c := range tunnelCommands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	fmt.Fprintf(tw, "  ssh\t%s\n", sshSummary)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "Groups:")
	for _, g := range groups {
		fmt.Fprintf(tw, "  %s\t%s\n", g.Name, g.Description)
	}
	fmt.Fprintln(tw)
	writeGlobalFlags(tw)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "Environment:")
	fmt.Fprintf(tw, "  %s\torigin of the service (default %s)\n", EnvURL, DefaultURL)
	fmt.Fprintf(tw, "  %s\tAPI base path (default %s)\n", EnvBasePath, DefaultBasePath)
	fmt.Fprintf(tw, "  %s\tbearer credential (an API key)\n", EnvToken)
	fmt.Fprintf(tw, "  %s\ttenantId of commands that take one, unless given\n", EnvTenant)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "Exit codes:")
	for _, c := range ExitClasses {
		meaning := c.Meaning
		if len(c.Codes) > 0 {
			meaning += ": " + strings.Join(c.Codes, ", ")
		}
		fmt.Fprintf(tw, "  %d\t%s\n", c.Exit, meaning)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nRun '%s <group> --help' for a group's commands.\n", Program)
}

func writeGlobalFlags(w io.Writer) {
	fmt.Fprintln(w, "Global flags (before the group, or anywhere a command has no flag of the name):")
	for _, g := range globalFlags {
		fmt.Fprintf(w, "  --%s %s\t%s\n", g.name, g.arg, g.help)
	}
	fmt.Fprintln(w, "  -h, --help\tshow help")
}

func writeGroupHelp(w io.Writer, g *Group) {
	fmt.Fprintf(w, "%s %s: %s\n\n", Program, g.Name, g.Description)
	fmt.Fprintf(w, "Usage:\n  %s [global flags] %s <command> [flags]\n\n", Program, g.Name)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "Commands:")
	for _, m := range g.Methods {
		fmt.Fprintf(tw, "  %s\t%s\n", m.Name, m.Description)
	}
	for _, name := range []string{"tail", "listen"} {
		if b := builtin(g, name); b != nil {
			fmt.Fprintf(tw, "  %s\t%s\n", b.Name, b.Description)
		}
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nRun '%s %s <command> --help' for a command's flags.\n", Program, g.Name)
}

func writeMethodHelp(out io.Writer, g *Group, m *Method) {
	var w bytes.Buffer
	defer func() { writeTrimmed(out, w.Bytes()) }()
	fmt.Fprintf(&w, "%s %s %s: %s\n\n", Program, g.Name, m.Name, m.Description)
	usage := fmt.Sprintf("  %s [global flags] %s %s", Program, g.Name, m.Name)
	for _, f := range m.Flags {
		if f.Required {
			usage += " " + flagUsage(f)
		}
	}
	if len(m.Flags) > 0 {
		usage += " [flags]"
	}
	fmt.Fprintf(&w, "Usage:\n%s\n\n", usage)
	switch {
	case m.Kind == "public":
		fmt.Fprintln(&w, "Public: no credential needed.")
	case m.Action != "":
		fmt.Fprintf(&w, "Kind %s; needs %s.\n", m.Kind, m.Action)
	}
	fmt.Fprintln(&w)
	tw := tabwriter.NewWriter(&w, 0, 4, 2, ' ', 0)
	if len(m.Flags) == 0 {
		fmt.Fprintln(tw, "Flags: none; the input is {}.")
	} else {
		fmt.Fprintln(tw, "Flags:")
	}
	for _, f := range m.Flags {
		var notes []string
		if f.Required {
			notes = append(notes, "required")
		}
		if len(f.Enum) > 0 {
			notes = append(notes, "one of "+strings.Join(f.Enum, ", "))
		}
		if f.Default != "" {
			notes = append(notes, "default "+f.Default)
		}
		if f.Field == TenantField {
			notes = append(notes, "default $"+EnvTenant)
		}
		if f.Nullable {
			notes = append(notes, "null through --input")
		}
		if isGlobal(f.Name) {
			notes = append(notes, "give the global --"+f.Name+" before the group")
		}
		help := f.Help
		if len(notes) > 0 {
			help = strings.TrimSpace(help + " (" + strings.Join(notes, "; ") + ")")
		}
		fmt.Fprintf(tw, "  %s\t%s\n", flagUsage(f), help)
	}
	fmt.Fprintln(tw)
	writeGlobalFlags(tw)
	_ = tw.Flush()
}

// flagUsage is a flag and its value in help: --name TYPE, --name[=BOOL].
func flagUsage(f Flag) string {
	switch f.Type {
	case Bool:
		return "--" + f.Name + "[=BOOL]"
	case Int:
		return "--" + f.Name + " INT"
	case Number:
		return "--" + f.Name + " NUMBER"
	case JSON:
		return "--" + f.Name + " JSON"
	}
	return "--" + f.Name + " STRING"
}

// writeTrimmed writes text without the spaces tabwriter leaves at the end
// of a line whose last cell is empty.
func writeTrimmed(w io.Writer, text []byte) {
	lines := bytes.Split(text, []byte("\n"))
	for i, l := range lines {
		lines[i] = bytes.TrimRight(l, " ")
	}
	_, _ = w.Write(bytes.Join(lines, []byte("\n")))
}

const loginSummary = "check an API key and save it, with the service's URL and the key's tenant, as a profile"

func writeLoginHelp(w io.Writer) {
	fmt.Fprintf(w, "%s login: %s.\n\n", Program, loginSummary)
	fmt.Fprintf(w, "Usage:\n  %s login --url URL --token TOKEN [--profile NAME]\n  %s login            (on a terminal: asks for the URL and the key)\n\n", Program, Program)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "Flags:")
	fmt.Fprintf(tw, "  --url URL\torigin of the service (also --cp-url; default $%s, else %s)\n", EnvURL, DefaultURL)
	fmt.Fprintf(tw, "  --token TOKEN\tthe API key to save (also --cp-token; default $%s when another flag is given)\n", EnvToken)
	fmt.Fprintf(tw, "  --profile NAME\tthe profile saved (default default); it becomes the current one\n")
	_ = tw.Flush()
	fmt.Fprintf(w, "\nThe key is checked with system.whoami and saved in $XDG_CONFIG_HOME/computectl/config.json\n(mode 0600; $%s names another file). Without flags and without a terminal,\nlogin refuses (exit 2) rather than save $%s.\n", EnvConfig, EnvToken)
}
