package rpc_test

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/go-faster/jx"
	"github.com/stretchr/testify/require"

	"computeplane/gen/api"
)

// TestGeneratedEncodersMatchEncodingJSON holds every generated EncodeJSON
// (what the envelope answers with) to encoding/json's bytes, for the zero
// value and for values filled at random: strings that need escaping (HTML
// characters, control characters, U+2028, invalid UTF-8), nil and empty
// slices and maps, nil and set pointers, floats of every magnitude.
func TestGeneratedEncodersMatchEncodingJSON(t *testing.T) {
	t.Parallel()
	types := api.OutputTypes()
	require.NotEmpty(t, types)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, v := range types {
		name := reflect.TypeOf(v).Elem().Name()
		for i := range 30 {
			if i > 0 {
				fill(rng, reflect.ValueOf(v).Elem(), 0)
			}
			want, err := json.Marshal(v)
			require.NoError(t, err, name)
			var e jx.Encoder
			require.NoError(t, v.(interface{ EncodeJSON(*jx.Encoder) error }).EncodeJSON(&e), name)
			require.Equal(t, string(want), string(e.Bytes()), "%s, value %d", name, i)
		}
	}
	var e jx.Encoder
	require.NoError(t, (*api.Site)(nil).EncodeJSON(&e))
	require.Equal(t, "null", string(e.Bytes()))
}

var samples = []string{
	"", "a", "sites/abc_01", "<script>&amp;</script>", "quote\" back\\slash", "tab\tnl\ncr\r\x01\x1f",
	"\u2028\u2029", "é€😀", "bad\xffutf8", "\x7f",
}

var floats = []float64{0, -0.0, 1, -1.5, 1e-7, 1e21, 123456789.125, 3.4e38, 5e-324}

// fill sets v to random content; depth bounds recursion.
func fill(rng *rand.Rand, v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(samples[rng.IntN(len(samples))])
	case reflect.Int64:
		v.SetInt([]int64{0, 1, -1, 300, 1 << 53, -1 << 63}[rng.IntN(6)])
	case reflect.Float64:
		v.SetFloat(floats[rng.IntN(len(floats))])
	case reflect.Bool:
		v.SetBool(rng.IntN(2) == 0)
	case reflect.Pointer:
		if rng.IntN(3) == 0 || depth > 4 {
			v.SetZero()
			return
		}
		p := reflect.New(v.Type().Elem())
		fill(rng, p.Elem(), depth+1)
		v.Set(p)
	case reflect.Slice:
		switch n := rng.IntN(4); {
		case n == 0 || depth > 4:
			v.SetZero()
		default:
			s := reflect.MakeSlice(v.Type(), n-1, n-1)
			for i := range n - 1 {
				fill(rng, s.Index(i), depth+1)
			}
			v.Set(s)
		}
	case reflect.Map:
		switch n := rng.IntN(4); {
		case n == 0 || depth > 4:
			v.SetZero()
		default:
			m := reflect.MakeMap(v.Type())
			for range n - 1 {
				k := reflect.New(v.Type().Key()).Elem()
				fill(rng, k, depth+1)
				val := reflect.New(v.Type().Elem()).Elem()
				fill(rng, val, depth+1)
				m.SetMapIndex(k, val)
			}
			v.Set(m)
		}
	case reflect.Interface:
		if rng.IntN(2) == 0 {
			v.SetZero()
			return
		}
		v.Set(reflect.ValueOf(map[string]any{"k": samples[rng.IntN(len(samples))], "n": 1.5}))
	case reflect.Struct:
		for i := range v.NumField() {
			fill(rng, v.Field(i), depth+1)
		}
	}
}
