package actionspec_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"computeplane/internal/workflows/actionspec"
)

func TestCheck(t *testing.T) {
	issues, ok := actionspec.Check("media.insert", map[string]any{"slot": "floppy", "extra": 1})
	assert.True(t, ok)
	assert.Equal(t, []actionspec.Issue{
		{Path: "extra", Message: "is not an input of media.insert"},
		{Path: "image", Message: "is required"},
		{Path: "slot", Message: `is one of [cd usb], not "floppy"`},
	}, issues)
	issues, ok = actionspec.Check("boot.set", map[string]any{"device": "${device}", "once": "yes"})
	assert.True(t, ok)
	assert.Equal(t, []actionspec.Issue{{Path: "once", Message: "is a boolean"}}, issues, "a workflow input is accepted for any type")
	issues, ok = actionspec.Check("power.on", map[string]any{})
	assert.True(t, ok)
	assert.Empty(t, issues)
	_, ok = actionspec.Check("format.c", nil)
	assert.False(t, ok)
}
