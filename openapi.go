// Package computeplane holds what the repository root publishes to the
// binary: the generated OpenAPI document.
package computeplane

import _ "embed"

// OpenAPI is openapi.yaml, generated from the catalog by `make gen`.
//
//go:embed openapi.yaml
var OpenAPI []byte
