package benchkit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteSectionReplacesTheWholeHeadingInEachPage(t *testing.T) {
	dir := t.TempDir()
	out, notes := filepath.Join(dir, "benchmarks.md"), filepath.Join(dir, "benchmarks-notes.md")
	// The hand-written section whose heading starts like the tool's comes
	// first: it stays, and the tool's own is replaced.
	require.NoError(t, os.WriteFile(notes, []byte("## Network: what the figures say\n\nhand\n\n## Network\n\nold\n\n## Other\n\nkept\n"), 0o644))
	require.NoError(t, WriteSection("## Network", "## Network\n\nnew\n\n", out, "", notes))
	b, err := os.ReadFile(notes)
	require.NoError(t, err)
	require.Equal(t, "## Network: what the figures say\n\nhand\n\n## Network\n\nnew\n\n## Other\n\nkept\n", string(b))
	// A page without the section gets it at the end.
	b, err = os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, "## Network\n\nnew\n", string(b))
}
