package docs

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"computeplane/tools/catalogc/catalog"
)

const (
	repoCatalog = "../../../catalog"
	testCatalog = "../testdata/catalog"
)

// renderPage renders the reference for a catalog and parses it.
func renderPage(t *testing.T, dir string) (*catalog.Catalog, []byte, *html.Node) {
	t.Helper()
	c, err := catalog.Load(dir)
	require.NoError(t, err)
	data, err := Render(c)
	require.NoError(t, err)
	doc, err := html.Parse(bytes.NewReader(data))
	require.NoError(t, err)
	return c, data, doc
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func text(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return b.String()
}

// index collects elements by id, and every element by tag.
func index(doc *html.Node) (byID map[string]*html.Node, byTag map[string][]*html.Node) {
	byID, byTag = map[string]*html.Node{}, map[string][]*html.Node{}
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			byTag[n.Data] = append(byTag[n.Data], n)
			if id := attr(n, "id"); id != "" {
				byID[id] = n
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	return byID, byTag
}

func TestPageNamesEveryMethod(t *testing.T) {
	for _, dir := range []string{repoCatalog, testCatalog} {
		t.Run(dir, func(t *testing.T) {
			c, _, doc := renderPage(t, dir)
			byID, byTag := index(doc)
			links := map[string]bool{}
			for _, a := range byTag["a"] {
				links[attr(a, "href")] = true
			}
			for _, m := range c.Methods() {
				art := byID[m.FullName()]
				require.NotNil(t, art, "no article for %s", m.FullName())
				assert.Equal(t, "article", art.Data)
				body := text(art)
				assert.Contains(t, body, m.FullName())
				assert.Contains(t, body, "POST {basePath}"+m.Route())
				assert.Contains(t, body, m.Phase)
				assert.Contains(t, body, m.Status)
				assert.Contains(t, body, m.Kind)
				for _, e := range m.Errors {
					assert.Contains(t, body, e)
				}
				for _, f := range m.Input.Fields {
					assert.Contains(t, body, f.Name)
				}
				assert.True(t, links["#"+m.FullName()], "the contents link %s", m.FullName())
			}
			for _, e := range c.Errors {
				assert.NotNil(t, byID["error-"+e.Code], e.Code)
			}
			for _, s := range c.Shapes {
				assert.NotNil(t, byID["shape-"+s.Name], s.Name)
			}
			for _, e := range c.Events {
				assert.NotNil(t, byID["event-"+e.Type], e.Type)
			}
			// Every in-page link lands.
			for href := range links {
				if id, ok := strings.CutPrefix(href, "#"); ok {
					assert.NotNil(t, byID[id], "dangling link %s", href)
				}
			}
		})
	}
}

// The page stands alone: one inline script (the search box) whose hash
// the server allows, no external script, stylesheet or image.
func TestSelfContained(t *testing.T) {
	_, _, doc := renderPage(t, repoCatalog)
	_, byTag := index(doc)
	require.Len(t, byTag["script"], 1)
	script := byTag["script"][0]
	assert.Empty(t, attr(script, "src"))
	sum := sha256.Sum256([]byte(text(script)))
	assert.Equal(t, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'", ScriptHash(), "the hash covers the script as served")
	assert.Empty(t, byTag["link"])
	assert.Empty(t, byTag["img"])
	require.Len(t, byTag["style"], 1)
	for _, a := range byTag["a"] {
		href := attr(a, "href")
		assert.False(t, strings.Contains(href, "://"), "external link %s", href)
	}
}

func TestFieldRows(t *testing.T) {
	_, _, doc := renderPage(t, testCatalog)
	byID, _ := index(doc)
	body := text(byID["things.create"])
	for _, want := range []string{
		"Warm", "map of string", "array of Mount", "object (free-form)", "any JSON value",
		"length 2 to 255", "1 to 100", "default 10", "at most 64 entries", "keys match ^[A-Z_][A-Z0-9_]{0,63}$",
		"one of egress | private | none", "nullable", "exactly one of machineId, offerId",
		"items: exactly one of volumeId, name", "values: length at most 1024", "thing.created",
		"Served since v0.1.",
	} {
		assert.Contains(t, body, want)
	}
	// Nested fields are indented under their parent.
	var nested []string
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "td" && strings.Contains(attr(n, "class"), "d1") {
			nested = append(nested, text(n))
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(byID["things.create"])
	assert.Subset(t, nested, []string{"min", "max", "mountPath", "team", "cost"})
	assert.Contains(t, text(byID["things.archive"]), "Planned for v0.2: answers NOT_IMPLEMENTED until then.")
}

func TestDeterministicAndEmbed(t *testing.T) {
	c, data, _ := renderPage(t, repoCatalog)
	again, err := Render(c)
	require.NoError(t, err)
	assert.Equal(t, data, again)
	assert.NotContains(t, string(data), "\r")

	files, err := Files(c)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, Write(dir, files))
	embed, err := os.ReadFile(filepath.Join(dir, EmbedFile))
	require.NoError(t, err)
	src := string(embed)
	assert.True(t, strings.HasPrefix(src, "// Code generated "))
	assert.Contains(t, src, "DO NOT EDIT.")
	assert.Contains(t, src, "package docs")
	assert.Contains(t, src, "//go:embed index.html\nvar IndexHTML []byte")
	index, err := os.ReadFile(filepath.Join(dir, IndexFile))
	require.NoError(t, err)
	assert.Equal(t, data, index)
}

// Every method shows a curl and a computectl call with its required input.
func TestExamples(t *testing.T) {
	c, err := catalog.Load(repoCatalog)
	require.NoError(t, err)
	for _, g := range c.Groups {
		for _, m := range g.Methods {
			curl, cli := examples(c, m)
			assert.Contains(t, curl, "/api/compute"+m.Route(), m.FullName())
			assert.True(t, strings.HasPrefix(cli, "computectl "+g.Name+" "+m.Name), cli)
		}
	}
	var create *catalog.Method
	for _, g := range c.Groups {
		for _, m := range g.Methods {
			if m.FullName() == "sites.create" {
				create = m
			}
		}
	}
	require.NotNil(t, create)
	curl, cli := examples(c, create)
	assert.Contains(t, curl, `-d '{"idempotencyKey":"key-1","kind":"shared","region":"eu-west","tenantId":"acme"}'`)
	assert.Contains(t, curl, `Authorization: Bearer $SERVICE_TOKEN`)
	assert.Equal(t, "computectl sites create --idempotency-key key-1 --kind shared --region eu-west", cli)
}
