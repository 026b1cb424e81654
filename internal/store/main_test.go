package store_test

import (
	"testing"

	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestMain(m *testing.M) { storetest.Main(m) }
