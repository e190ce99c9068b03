// Command catalogc generates everything the API catalog implies.
//
//	catalogc gen     writes gen/api, openapi.yaml, the HTML reference
//	                 (gen/docs) and the computectl commands (gen/cli), then
//	                 checks the frozen surface
//	catalogc check   loads the catalog and checks the frozen surface
//	catalogc freeze  records additions to catalog/frozen/surface.txt
//
// The frozen surface check fails with one line per violation:
// catalog/frozen/surface.txt:<line>: <frozen line>: <why>.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"computeplane/tools/catalogc/catalog"
	"computeplane/tools/catalogc/cligen"
	"computeplane/tools/catalogc/docs"
	"computeplane/tools/catalogc/freeze"
	"computeplane/tools/catalogc/gogen"
	"computeplane/tools/catalogc/openapi"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "catalogc:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fl := flag.NewFlagSet("catalogc", flag.ContinueOnError)
	dir := fl.String("catalog", "catalog", "catalog directory")
	apiDir := fl.String("api", "gen/api", "output directory of the Go API package")
	openapiPath := fl.String("openapi", "openapi.yaml", "output path of the OpenAPI document")
	apiVersion := fl.String("api-version", openapi.DefaultAPIVersion, "info.version of the OpenAPI document")
	docsDir := fl.String("docs", "gen/docs", "output directory of the HTML reference")
	cliDir := fl.String("cli", "gen/cli", "output directory of the computectl commands")
	surface := fl.String("surface", "", "frozen surface file (default <catalog>/frozen/surface.txt)")
	pluginGlob := fl.String("plugins", catalog.PluginsGlob, "catalog directories of the plugins built with the service (docs/plugins.md)")
	if len(args) == 0 {
		return fmt.Errorf("usage: catalogc gen|check|freeze [flags]")
	}
	cmd := args[0]
	if err := fl.Parse(args[1:]); err != nil {
		return err
	}
	if *surface == "" {
		*surface = filepath.Join(*dir, "frozen", "surface.txt")
	}
	cat, err := catalog.LoadWithPlugins(*dir, *pluginGlob)
	if err != nil {
		return err
	}
	switch cmd {
	case "check":
		return checkSurface(*surface, cat)
	case "gen":
		files, err := gogen.Files(cat)
		if err != nil {
			return err
		}
		if err := gogen.Write(*apiDir, files); err != nil {
			return err
		}
		doc, err := openapi.Generate(cat, openapi.Options{APIVersion: *apiVersion})
		if err != nil {
			return err
		}
		if err := openapi.Write(*openapiPath, doc); err != nil {
			return err
		}
		pages, err := docs.Files(cat)
		if err != nil {
			return err
		}
		if err := docs.Write(*docsDir, pages); err != nil {
			return err
		}
		commands, err := cligen.Files(cat)
		if err != nil {
			return err
		}
		if err := cligen.Write(*cliDir, commands); err != nil {
			return err
		}
		return checkSurface(*surface, cat)
	case "freeze":
		lines, err := readSurface(*surface)
		if err != nil {
			return err
		}
		if v := freeze.Check(lines, cat); len(v) > 0 {
			return violations(*surface, v, "recording would not lift them; restore what they name first")
		}
		if err := os.MkdirAll(filepath.Dir(*surface), 0o755); err != nil {
			return err
		}
		return os.WriteFile(*surface, freeze.Format(freeze.Record(lines, cat)), 0o644)
	default:
		return fmt.Errorf("unknown command %q", cmd)
	}
}

// readSurface reads the frozen surface; a missing file is an empty surface.
func readSurface(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return freeze.Parse(data), nil
}

func checkSurface(path string, cat *catalog.Catalog) error {
	lines, err := readSurface(path)
	if err != nil {
		return err
	}
	if v := freeze.Check(lines, cat); len(v) > 0 {
		return violations(path, v, "the specification's Versioning rule 3 forbids these; "+
			"planned methods may change freely, served ones may only widen")
	}
	return nil
}

func violations(path string, vs []freeze.Violation, hint string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "the catalog narrows the frozen API surface (%d violations; %s):", len(vs), hint)
	for _, v := range vs {
		fmt.Fprintf(&b, "\n%s:%d: %s: %s", filepath.ToSlash(path), v.Line, v.Text, v.Why)
	}
	return errors.New(b.String())
}
