#!/usr/bin/env bash
# foreign-clients.sh checks that openapi.yaml is consumed as it is by the
# generators users pick: it generates a Go client with oapi-codegen and
# TypeScript types with openapi-typescript, and compiles both (go build;
# tsc --strict on a file that uses the types). A rename that breaks either
# fails here. Both run in a temporary directory; nothing is added to the
# project's go.mod or package files. Versions are pinned.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
OAPI_CODEGEN=github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.4.1
OPENAPI_TYPESCRIPT=openapi-typescript@7.4.4
TYPESCRIPT=typescript@5.6.3

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "foreign-clients: oapi-codegen Go client"
mkdir "$work/go"
(
	cd "$work/go"
	go mod init example.com/foreignclient >/dev/null 2>&1
	go run "$OAPI_CODEGEN" -generate types,client -package foreignclient "$REPO/openapi.yaml" >client.go
	go mod tidy >/dev/null 2>&1
	go build ./...
)

echo "foreign-clients: openapi-typescript types"
if ! command -v npm >/dev/null; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq && apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
mkdir "$work/ts"
(
	cd "$work/ts"
	npm init -y >/dev/null
	npm install --silent --no-audit --no-fund "$OPENAPI_TYPESCRIPT" "$TYPESCRIPT" >/dev/null 2>&1
	npx --no-install openapi-typescript "$REPO/openapi.yaml" -o api.d.ts >/dev/null
	cat >use.ts <<'TS'
import type { paths, components } from "./api";

type Site = components["schemas"]["Site"];
type SitesListBody = NonNullable<paths["/sites/list"]["post"]["requestBody"]>["content"]["application/json"];
type SitesListOK = paths["/sites/list"]["post"]["responses"][200]["content"]["application/json"];

const input: SitesListBody = { tenantId: "acme", limit: 10 };
const site: Pick<Site, "siteId" | "region"> = { siteId: "site_x", region: "eu-west" };
function first(page: SitesListOK): Site | undefined {
  return page.data.items[0];
}
export { input, site, first };
TS
	npx --no-install tsc --noEmit --strict use.ts
)
echo "foreign-clients: both compile"
