// Package catalog holds the API catalog (the *.yaml files tools/catalogc
// reads) and the JSON Schemas of documents the API accepts, embedded here
// so that the services validate with the very file the catalog publishes.
package catalog

import _ "embed"

// ProfileSchema is the JSON Schema (draft 2020-12) of a profile document
// (docs/profiles.md).
//
//go:embed profile.schema.json
var ProfileSchema []byte
