package cluster

import (
	"testing"

	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestMain stops the throwaway PostgreSQL that the dispatch benchmark may
// have started (storetest), before the process ends.
func TestMain(m *testing.M) { storetest.Main(m) }
