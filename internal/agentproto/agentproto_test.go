package agentproto

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSecretReferences(t *testing.T) {
	ud := "#!/bin/sh\nexport A=secret://tenants/acme/a B='secret://tenants/acme/b'\ncurl https://x.example/secret://no\necho secret://tenants/acme/a\nxsecret://tenants/acme/c"
	assert.Equal(t, []string{"secret://tenants/acme/a", "secret://tenants/acme/b"}, SecretReferences(ud))
	assert.Empty(t, SecretReferences("no references"))
}
