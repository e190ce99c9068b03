package cli

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func output(t *testing.T, format, data string) string {
	t.Helper()
	var b strings.Builder
	require.NoError(t, WriteOutput(&b, format, []byte(data)))
	return b.String()
}

func TestTableObject(t *testing.T) {
	t.Parallel()
	got := output(t, OutputTable, `{"zeta":"z","alpha":1.50,"ok":true,"gone":null,"empty":"","tabbed":"a\tb",
		"nested":{"b":{"c":"<d>"},"a":[1,"x"]},"none":{},"list":[{"k":"v"}]}`)
	assert.Equal(t, `zeta        z
alpha       1.50
ok          true
gone        -
empty       ""
tabbed      "a\tb"
nested.b.c  <d>
nested.a    [1,"x"]
none        {}
list        [{"k":"v"}]
`, got)
}

func TestTableList(t *testing.T) {
	t.Parallel()
	got := output(t, OutputTable, `{"items":[
		{"id":"a","size":1,"tags":["x"],"note":null,"spec":{"cpu":2,"mem":4}},
		{"id":"bb","extra":true,"size":22,"tags":["x","y"],"note":"`+strings.Repeat("w", 50)+`"}
	],"cursor":"c1","total":2}`)
	// Nested values are summarised, wide ones cut.
	assert.Equal(t, `id  size  tags       note                                      spec        extra
a   1     [1 item]   -                                         {cpu, mem}  -
bb  22    [2 items]  `+strings.Repeat("w", 39)+`…  -           true

cursor  c1
total   2
`, got)

	assert.Equal(t, "(no items)\n\ncursor  -\n", output(t, OutputTable, `{"items":[],"cursor":null}`))
	assert.Equal(t, "(no items)\n", output(t, OutputTable, `{"items":[]}`))
	// items of scalars is not a list of objects: a plain row.
	assert.Equal(t, "items  [1,2]\n", output(t, OutputTable, `{"items":[1,2]}`))
	// Not an object at all.
	assert.Equal(t, "42\n", output(t, OutputTable, `42`))
}

func TestJSONOutput(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "{\n  \"b\": 1,\n  \"a\": [\n    \"<x>\"\n  ]\n}\n", output(t, OutputJSON, `{"b":1,"a":["<x>"]}`))
	var b strings.Builder
	assert.Error(t, WriteOutput(&b, OutputTable, []byte(`{"a":1} 2`)))
	assert.Error(t, WriteOutput(&b, "yaml", []byte(`{}`)))
}
