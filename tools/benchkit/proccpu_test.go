package benchkit

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestProcessCPUGrowsWithWork(t *testing.T) {
	before, err := ProcessCPU(os.Getpid())
	require.NoError(t, err)
	for end := time.Now().Add(150 * time.Millisecond); time.Now().Before(end); {
	}
	after, err := ProcessCPU(os.Getpid())
	require.NoError(t, err)
	require.Greater(t, after, before)
	_, err = ProcessCPU(-1)
	require.Error(t, err)
}
