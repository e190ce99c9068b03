package plugins

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
)

// A plugin's event payload is checked against the payload its catalog
// declares (plugins/example/catalog/events.yaml).
func TestEventPayloadsFitTheirCatalog(t *testing.T) {
	require.NoError(t, checkPayload("example", api.EventExampleNoteCreated, []byte(`{"noteId":"note_1","title":"t"}`)))
	require.NoError(t, checkPayload("example", api.EventExampleNoteDeleted, []byte(`{"noteId":"note_1"}`)))
	for _, c := range []struct{ name, typ, data, want string }{
		{"a required field missing", api.EventExampleNoteCreated, `{"noteId":"note_1"}`, "title"},
		{"a field of another type", api.EventExampleNoteCreated, `{"noteId":"note_1","title":7}`, "title"},
		{"an undeclared field", api.EventExampleNoteDeleted, `{"noteId":"note_1","secret":"x"}`, "secret"},
		{"not an object", api.EventExampleNoteDeleted, `[]`, "object"},
		{"not JSON", api.EventExampleNoteDeleted, `{`, "not JSON"},
		{"a type no plugin declares", "site.created", `{}`, "no plugin catalog declares"},
	} {
		err := checkPayload("example", c.typ, []byte(c.data))
		require.Error(t, err, c.name)
		assert.Contains(t, err.Error(), c.want, c.name)
	}
}
