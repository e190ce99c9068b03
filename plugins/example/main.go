// Command example is the example plugin of the service (docs/plugins.md):
// notes a tenant keeps, stored by this process in a JSON file of its data
// directory, each change publishing an event. Its methods are declared in
// catalog/notes.yaml and served at {basePath}/plugins/example/notes/*; the
// service validates their input, decides compute:example:* and writes the
// events and the audit row in the call's transaction before this process
// is asked anything about a call.
//
// Build it with `go build -o example ./plugins/example` and name the binary
// with its SHA-256 in the plugins option.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"computeplane/pluginproto"
)

// ID is the plugin's id: the directory of its catalog.
const ID = "example"

func main() {
	dir := os.Getenv(pluginproto.EnvDataDir)
	if dir == "" {
		fmt.Fprintln(os.Stderr, "example: started without a data directory; the service starts this plugin")
		os.Exit(2)
	}
	pluginproto.Serve(&notes{path: filepath.Join(dir, "notes.json")})
}

// note is one kept note, as the catalog's ExampleNote writes it.
type note struct {
	NoteID    string `json:"noteId"`
	TenantID  string `json:"tenantId"`
	Title     string `json:"title"`
	Body      string `json:"body"`
	CreatedBy string `json:"createdBy"`
	CreatedAt string `json:"createdAt"`
}

// notes keeps every tenant's notes in one file, rewritten whole on each
// change (renamed into place, so a crash leaves the old or the new file).
type notes struct {
	path string
	mu   sync.Mutex
}

func (n *notes) Describe(context.Context) (*pluginproto.Description, error) {
	return &pluginproto.Description{PluginID: ID, Methods: []string{"notes.create", "notes.list", "notes.delete"}}, nil
}

func (n *notes) Call(_ context.Context, req *pluginproto.CallRequest) (*pluginproto.CallResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch req.Method {
	case "notes.create":
		var in struct{ TenantID, Title, Body string }
		if err := json.Unmarshal(req.Input, &in); err != nil {
			return nil, err
		}
		all, err := n.load()
		if err != nil {
			return nil, err
		}
		nt := note{NoteID: newID(), TenantID: in.TenantID, Title: in.Title, Body: in.Body,
			CreatedBy: req.Caller.IdentityID, CreatedAt: time.Now().UTC().Format("2006-01-02T15:04:05.000Z07:00")}
		if err := n.save(append(all, nt)); err != nil {
			return nil, err
		}
		return answer(nt, pluginproto.Event{Type: "example.note.created", Subject: nt.NoteID,
			Data: mustJSON(map[string]string{"noteId": nt.NoteID, "title": nt.Title})})
	case "notes.list":
		var in struct{ TenantID string }
		if err := json.Unmarshal(req.Input, &in); err != nil {
			return nil, err
		}
		all, err := n.load()
		if err != nil {
			return nil, err
		}
		items := []note{}
		for _, nt := range all {
			if nt.TenantID == in.TenantID {
				items = append(items, nt)
			}
		}
		return answer(map[string]any{"items": items})
	case "notes.delete":
		var in struct{ TenantID, NoteID string }
		if err := json.Unmarshal(req.Input, &in); err != nil {
			return nil, err
		}
		all, err := n.load()
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(all, func(nt note) bool { return nt.NoteID == in.NoteID && nt.TenantID == in.TenantID })
		if i < 0 {
			return nil, pluginproto.Errorf("NOT_FOUND", "note %s not found", in.NoteID)
		}
		if err := n.save(slices.Delete(all, i, i+1)); err != nil {
			return nil, err
		}
		return answer(map[string]bool{"deleted": true}, pluginproto.Event{Type: "example.note.deleted", Subject: in.NoteID,
			Data: mustJSON(map[string]string{"noteId": in.NoteID})})
	}
	return nil, pluginproto.Errorf("NOT_IMPLEMENTED", "the example plugin has no method %s", req.Method)
}

func (n *notes) load() ([]note, error) {
	b, err := os.ReadFile(n.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var all []note
	return all, json.Unmarshal(b, &all)
}

func (n *notes) save(all []note) error {
	b, err := json.Marshal(all)
	if err != nil {
		return err
	}
	tmp := n.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, n.path)
}

func answer(out any, events ...pluginproto.Event) (*pluginproto.CallResponse, error) {
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	return &pluginproto.CallResponse{Output: b, Events: events}, nil
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// newID is note_ and 26 random characters of the lowercase Crockford
// alphabet, the shape the catalog's noteId pattern accepts.
func newID() string {
	const alphabet = "0123456789abcdefghjkmnpqrstvwxyz"
	b := make([]byte, 26)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[b[i]&31]
	}
	return "note_" + string(b)
}
