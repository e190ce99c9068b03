package gogen

import (
	"fmt"

	jen "github.com/dave/jennifer/jen"

	"computeplane/tools/catalogc/catalog"
)

const jxPkg = "github.com/go-faster/jx"

// encoded is a struct type declared for output (not input): it gets an
// EncodeJSON method.
type encoded struct {
	name   string
	schema *catalog.Schema
}

// jsonFile writes, for every output struct, EncodeJSON: the bytes
// encoding/json would write for it (field order, omitempty, null for nil
// slices, HTML-safe string escaping, ES6 floats), without reflection, so the
// envelope encodes an answer into a pooled buffer. Values the catalog does
// not type (any, free-form objects) and maps, whose keys encoding/json
// sorts and escapes, go through wire.EncodeAny, which is encoding/json.
func (g *generator) jsonFile() *jen.File {
	f := newFile()
	for _, t := range g.encoded {
		f.Commentf("EncodeJSON writes v as encoding/json would, without reflection.")
		f.Func().Params(jen.Id("v").Op("*").Id(t.name)).Id("EncodeJSON").
			Params(jen.Id("e").Op("*").Qual(jxPkg, "Encoder")).Error().
			BlockFunc(func(b *jen.Group) {
				b.If(jen.Id("v").Op("==").Nil()).Block(jen.Id("e").Dot("Null").Call(), jen.Return(jen.Nil()))
				b.Id("e").Dot("ObjStart").Call()
				for _, fd := range t.schema.Fields {
					g.encodeField(b, fd)
				}
				b.Id("e").Dot("ObjEnd").Call()
				b.Return(jen.Nil())
			})
	}
	f.Comment("OutputTypes lists a new value of every type with EncodeJSON, for tests that hold it to encoding/json.")
	f.Func().Id("OutputTypes").Params().Index().Any().Block(
		jen.Return(jen.Index().Any().ValuesFunc(func(v *jen.Group) {
			for _, t := range g.encoded {
				v.Line().New(jen.Id(t.name))
			}
			v.Line()
		})),
	)
	return f
}

// encodeField writes one field as encoding/json does: omitempty fields
// (optional and not nullable) are left out when empty.
func (g *generator) encodeField(b *jen.Group, fd *catalog.Field) {
	s := fd.Schema
	x := jen.Id("v").Dot(exported(fd.Name))
	omitempty := !s.Required && !s.Nullable
	start := jen.Id("e").Dot("FieldStart").Call(jen.Lit(fd.Name))
	body := append([]jen.Code{start}, g.encodeFieldValue(s, x)...)
	empty := g.emptyCheck(s, x)
	if !omitempty || empty == nil { // a struct value is never empty to encoding/json
		for _, c := range body {
			b.Add(c)
		}
		return
	}
	b.If(jen.Op("!").Parens(empty)).Block(body...)
}

// fieldNilable and fieldPointer say how fieldType represents s.
func fieldNilable(s *catalog.Schema) bool {
	return s.Type == catalog.TAny || s.Type == catalog.TArray || s.Type == catalog.TMap || s.FreeForm()
}

func fieldPointer(s *catalog.Schema) bool {
	return !fieldNilable(s) && (s.Nullable || !s.Required && !s.HasDefault)
}

// emptyCheck is encoding/json's isEmptyValue for the field's Go type; nil
// for a struct value (never empty).
func (g *generator) emptyCheck(s *catalog.Schema, x *jen.Statement) jen.Code {
	switch {
	case s.Type == catalog.TAny:
		return jen.Add(x.Clone()).Op("==").Nil()
	case fieldNilable(s): // slices and maps
		return jen.Len(x.Clone()).Op("==").Lit(0)
	case fieldPointer(s):
		return jen.Add(x.Clone()).Op("==").Nil()
	}
	switch s.Type {
	case catalog.TString:
		if s.Format == catalog.FormatByte {
			return jen.Len(x.Clone()).Op("==").Lit(0)
		}
		return jen.Add(x.Clone()).Op("==").Lit("")
	case catalog.TInteger, catalog.TNumber:
		return jen.Add(x.Clone()).Op("==").Lit(0)
	case catalog.TBoolean:
		return jen.Op("!").Add(x.Clone())
	}
	return nil
}

// encodeFieldValue writes the value of a field of Go type fieldType(s).
func (g *generator) encodeFieldValue(s *catalog.Schema, x *jen.Statement) []jen.Code {
	if fieldPointer(s) {
		return []jen.Code{jen.If(jen.Add(x.Clone()).Op("==").Nil()).Block(
			jen.Id("e").Dot("Null").Call(),
		).Else().Block(g.encodeBase(s, jen.Parens(jen.Op("*").Add(x.Clone())), 0)...)}
	}
	return g.encodeBase(s, x, 0)
}

// encodeElem writes a value of Go type elemType(s).
func (g *generator) encodeElem(s *catalog.Schema, x *jen.Statement, depth int) []jen.Code {
	if s.Nullable && s.Type != catalog.TAny {
		return []jen.Code{jen.If(jen.Add(x.Clone()).Op("==").Nil()).Block(
			jen.Id("e").Dot("Null").Call(),
		).Else().Block(g.encodeBase(s, jen.Parens(jen.Op("*").Add(x.Clone())), depth)...)}
	}
	return g.encodeBase(s, x, depth)
}

// encodeBase writes a value of Go type baseType(s); depth names the loop
// variables of nested arrays.
func (g *generator) encodeBase(s *catalog.Schema, x *jen.Statement, depth int) []jen.Code {
	e := jen.Id("e")
	switch s.Type {
	case catalog.TString:
		if s.Format == catalog.FormatByte {
			return []jen.Code{jen.If(jen.Add(x.Clone()).Op("==").Nil()).Block(
				e.Clone().Dot("Null").Call(),
			).Else().Block(e.Clone().Dot("Base64").Call(x.Clone()))}
		}
		return []jen.Code{e.Clone().Dot("StrEscape").Call(x.Clone())}
	case catalog.TInteger:
		return []jen.Code{e.Clone().Dot("Int64").Call(x.Clone())}
	case catalog.TNumber:
		return []jen.Code{e.Clone().Dot("Float64").Call(x.Clone())}
	case catalog.TBoolean:
		return []jen.Code{e.Clone().Dot("Bool").Call(x.Clone())}
	case catalog.TArray:
		i := jen.Id(fmt.Sprintf("i%d", depth))
		item := jen.Add(x.Clone()).Index(i.Clone())
		return []jen.Code{jen.If(jen.Add(x.Clone()).Op("==").Nil()).Block(
			e.Clone().Dot("Null").Call(),
		).Else().Block(
			e.Clone().Dot("ArrStart").Call(),
			jen.For(i.Clone().Op(":=").Range().Add(x.Clone())).Block(g.encodeElem(s.Items, item, depth+1)...),
			e.Clone().Dot("ArrEnd").Call(),
		)}
	}
	if s.Type == catalog.TAny || s.Type == catalog.TMap || s.FreeForm() {
		return []jen.Code{jen.If(jen.Err().Op(":=").Qual(wirePkg, "EncodeAny").Call(e.Clone(), x.Clone()), jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Err()))}
	}
	// A named or inline struct: its own EncodeJSON.
	return []jen.Code{jen.If(jen.Err().Op(":=").Add(x.Clone()).Dot("EncodeJSON").Call(e.Clone()), jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Err()))}
}
