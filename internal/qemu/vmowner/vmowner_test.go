package vmowner_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/qemu/vmowner"
)

// A process named like qemu that inherited the owner's mark is found
// (after its parent is gone too), one without the mark is not, and Kill
// ends it.
func TestLeftoversFollowTheMark(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	data, err := os.ReadFile(sleep)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, data, 0o755))

	token := vmowner.Mark()
	require.Equal(t, token, os.Getenv(vmowner.Env))
	// Started by a shell that exits at once, as a VM outlives its daemon.
	sh := exec.Command("sh", "-c", bin+" 60 >/dev/null 2>&1 &")
	require.NoError(t, sh.Run())
	unmarked := exec.Command(bin, "60")
	unmarked.Env = []string{vmowner.Env + "=someone-else"}
	require.NoError(t, unmarked.Start())
	t.Cleanup(func() { _ = unmarked.Process.Kill(); _, _ = unmarked.Process.Wait() })

	var left []vmowner.Process
	require.Eventually(t, func() bool { left = vmowner.Leftovers(token); return len(left) == 1 }, 5*time.Second, 20*time.Millisecond)
	assert.Contains(t, left[0].Cmdline, bin+" 60")
	assert.NotEqual(t, unmarked.Process.Pid, left[0].PID, "another owner's process is not listed")

	vmowner.Kill(left)
	assert.Empty(t, vmowner.WaitGone(token, 5*time.Second))
}
